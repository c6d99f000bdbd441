"""The shared pieces under every command: the one encoding of an example, the padded-batch
classifier, the built-in model's name, error first lines and the recorded library versions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attattr_cli.data.types import Example
from attattr_cli.engine.batching import accuracy, classify, pad_id_of
from attattr_cli.engine.encoding import decoder_start_of, encode
from attattr_cli.engine.heads import Batches, logits_under
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.scorer import Scorer
from attattr_cli.errors import DataError, first_line
from attattr_cli.models.loading import prepare
from conftest import build_model

PAIR = Example(4, "w1 w2 w3 w4 w5", "w6 w7 w8", label=1)
SINGLE = Example(5, "w9 w10 w11 w12", label=0)


def test_a_pair_gives_the_tokenizers_ids_token_types_and_segments(tokenizer):
    enc = encode(tokenizer, PAIR)
    want = tokenizer("w1 w2 w3 w4 w5", "w6 w7 w8")
    assert enc.input_ids == list(want["input_ids"])
    assert enc.token_type_ids == list(want["token_type_ids"])
    assert enc.tokens == tokenizer.convert_ids_to_tokens(want["input_ids"])
    # [CLS] five words [SEP] three words [SEP]: special tokens -1, then the segment each word came from
    assert enc.segment_ids == [-1] + [0] * 5 + [-1] + [1] * 3 + [-1]
    assert not enc.truncated and enc.decoder_input_ids is None
    row = enc.model_inputs()
    assert row["attention_mask"] == [1] * len(enc.input_ids) and row["token_type_ids"] == enc.token_type_ids


def test_a_single_sentence_has_one_segment(tokenizer):
    enc = encode(tokenizer, SINGLE)
    assert enc.input_ids == list(tokenizer("w9 w10 w11 w12")["input_ids"])
    assert enc.segment_ids == [-1, 0, 0, 0, 0, -1]
    assert encode(tokenizer, SINGLE, tokens=False).tokens == []


def test_too_long_is_refused_or_cut_like_the_tokenizer_cuts(tokenizer):
    with pytest.raises(DataError, match=r"example 4 has 11 tokens; the model takes at most 8"):
        encode(tokenizer, PAIR, max_length=8)
    cut = encode(tokenizer, PAIR, max_length=8, truncate=True)
    want = tokenizer("w1 w2 w3 w4 w5", "w6 w7 w8", truncation=True, max_length=8)
    assert cut.truncated and len(cut.input_ids) == 8
    assert cut.input_ids == list(want["input_ids"]) and cut.token_type_ids == list(want["token_type_ids"])
    assert cut.segment_ids.count(-1) == 3  # the special tokens stay; words of the longer segment go
    assert not encode(tokenizer, PAIR, max_length=11).truncated  # exactly the limit fits


def test_a_tokenizer_without_token_types_gives_none(tokenizer):
    class NoTypes:  # the tokenizer, but the model it goes with takes no token_type_ids
        model_input_names = ["input_ids", "attention_mask"]

        def __call__(self, *args, **kw):
            return tokenizer(*args, **kw)

        def convert_ids_to_tokens(self, ids):
            return tokenizer.convert_ids_to_tokens(ids)

    enc = encode(NoTypes(), PAIR)
    assert enc.token_type_ids is None and "token_type_ids" not in enc.model_inputs()
    assert enc.segment_ids == encode(tokenizer, PAIR).segment_ids


def test_an_encoder_decoder_input_is_shifted_right_as_transformers_does(tokenizer):
    from transformers.models.bart.modeling_bart import shift_tokens_right

    model = build_model("bart", num_labels=2, layers=1)
    start = decoder_start_of(model)
    assert start == model.config.decoder_start_token_id == 3
    enc = encode(tokenizer, PAIR, decoder_start=start)
    want = shift_tokens_right(torch.tensor([enc.input_ids]), model.config.pad_token_id, start)[0].tolist()
    assert enc.decoder_input_ids == want
    assert enc.decoder_tokens == tokenizer.convert_ids_to_tokens(want)
    scorer = Scorer(prepare(model, tokenizer, "tiny-bart"), ScoreOptions(steps=2))
    assert scorer.encode(PAIR) == enc  # the scorer encodes through the same function


def _examples():
    words = [f"w{i}" for i in range(1, 30)]
    out = []
    for i in range(7):  # pairs and single sentences of different lengths
        a = " ".join(words[i:i + 2 + i])
        out.append(Example(i, a, " ".join(words[:3 + (i % 3)]) if i % 2 else None, label=i % 3))
    return out


def _one_by_one(model, rows):
    with torch.no_grad():
        return torch.cat([model(**{k: torch.tensor([v]) for k, v in r.items()}).logits.float() for r in rows])


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_the_shared_classifier_equals_an_unbatched_forward(tokenizer, kind):
    model = build_model(kind, num_labels=3, layers=2)
    if kind == "gpt2":  # a decoder classifier reads the last token that is not padding
        model.config.pad_token_id = 0
    rows = [encode(tokenizer, e, tokens=False).model_inputs() for e in _examples()]
    assert len({len(r["input_ids"]) for r in rows}) > 3  # the batches really are padded
    model.train()  # the classifier evaluates in eval mode and gives the flag back
    got = classify(model, rows, pad_id_of(model, tokenizer), batch_size=3)
    assert model.training
    model.eval()
    want = _one_by_one(model, rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    alone = classify(model, rows, None, batch_size=3)  # nothing to pad with: one row at a time
    torch.testing.assert_close(alone, want, rtol=1e-5, atol=1e-5)
    seen = []
    classify(model, rows, 0, batch_size=4, on_batch=lambda done, total, b: seen.append((done, total, len(b.positions))))
    assert seen == [(1, 2, 4), (2, 2, 3)]


def test_head_masking_batches_use_the_same_encoding_and_classifier(tokenizer):
    loaded = prepare(build_model("bert", num_labels=3, layers=2), tokenizer, "tiny-bert")
    examples = _examples()
    batches = Batches(loaded, examples, batch_size=3)
    rows = [encode(tokenizer, e, tokens=False).model_inputs() for e in examples]
    torch.testing.assert_close(logits_under(loaded, batches, None), _one_by_one(loaded.model, rows),
                               rtol=1e-5, atol=1e-5)
    assert batches.gold().tolist() == [e.label for e in examples]
    with pytest.raises(DataError, match="example 0 has"):
        Batches(loaded, [Example(0, " ".join(["w1"] * 60))])


def test_accuracy_counts_only_rows_with_gold():
    assert accuracy([0, 1, 2, 1], [0, None, 1, 1]) == pytest.approx(2 / 3)
    assert np.isnan(accuracy([1], [None]))


def test_the_builtin_model_is_shown_under_its_id(tmp_path):
    from attattr_cli.models.default import DEFAULT_MODEL_DIR, DEFAULT_MODEL_ID, display_id, is_builtin

    assert display_id(DEFAULT_MODEL_DIR) == DEFAULT_MODEL_ID
    assert display_id(str(DEFAULT_MODEL_DIR / ".." / DEFAULT_MODEL_DIR.name)) == DEFAULT_MODEL_ID
    assert display_id(str(tmp_path)) == str(tmp_path) and not is_builtin(tmp_path)
    assert display_id("org/some-model") == "org/some-model"


def test_first_line_and_library_versions():
    assert first_line(ValueError("\n  first problem  \nmore detail")) == "first problem"
    assert first_line(KeyError()) == "KeyError"
    from attattr_cli import __version__
    from attattr_cli.engine.provenance import libraries

    light = libraries(frameworks=False)
    assert light["attattr"] == __version__ and "torch" not in light and "transformers" not in light
    assert libraries()["torch"] == torch.__version__


def test_a_pair_on_a_model_with_one_token_type_goes_in_as_type_zero(tokenizer):
    """A model whose embeddings hold one token type (type_vocab_size 1: gte, xlm-roberta-xl):
    its tokenizer may still mark a pair's second segment as type 1, which has no row; the pair
    is scored with every token type 0, as the model's own output for it says."""
    import torch
    import transformers as tf

    import attattr_cli as aa
    from attattr_cli.models.loading import prepare
    from conftest import WORDS

    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=48, type_vocab_size=1, num_labels=2)
    model = tf.BertForSequenceClassification(cfg).eval()
    loaded = prepare(model, tokenizer, "tiny-one-type")
    res = aa.score(loaded, [("w1 w2 w3", "w4 w5")], steps=2, target="predicted")
    ids = tokenizer("w1 w2 w3", "w4 w5", return_tensors="pt")
    with torch.no_grad():
        own = torch.softmax(model(input_ids=ids["input_ids"], token_type_ids=torch.zeros_like(ids["input_ids"])).logits, -1)
    assert float(res[0].f_full) == pytest.approx(float(own.max()), rel=1e-5)
    pred = aa.predict(loaded, [("w1 w2 w3", "w4 w5")])
    assert pred.probabilities[0] == pytest.approx(own[0].numpy(), rel=1e-5)
