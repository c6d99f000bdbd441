"""``aggregate="words"`` (``--aggregate words``) on the token tables, triggers and faithfulness:
words are analysis/aggregate.py's word groups, and every number is the sum of the token-level
ones (checked here against sums written out by hand over a WordPiece vocabulary with pieces)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attattr_cli as aa
from attattr_cli.errors import OptionError
from attattr_cli.store import Store, read_token_importance
from conftest import build_model, one_error_line, run_cli, save_sentiment_model

# as many entries as the tiny models' vocabulary (45): whole words w0..w29 and pieces ##a..##j
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(30)], *[f"##{c}" for c in "abcdefghij"]]
ROWS = ["w1a w2 w3bc w4", "w5 w6d w7 w8e w9", "w10fg w11 w12h w13"]
WORDS_OF_0 = ["[CLS]", "w1a", "w2", "w3bc", "w4", "[SEP]"]


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    """(model folder, data file, store): a tiny BERT whose tokenizer splits words into pieces,
    three examples scored with 2 steps."""
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("pieces")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast(str(d / "vocab.txt"), model_max_length=48)
    model_dir = save_sentiment_model(build_model("bert", num_labels=2), tok, d / "model")
    data = d / "data.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{r}\t{i % 2}\n" for i, r in enumerate(ROWS)))
    out = d / "s.h5"
    r = run_cli("score", "--model", model_dir, "--data", data, "--task", "sst2", "--steps", "2", "--out", out, "-q")
    assert r.exit_code == 0, r.output
    return model_dir, data, out


def _groups(tokens):
    """Words of WordPiece tokens written out: a token starting with ## joins the word before."""
    groups = []
    for i, t in enumerate(tokens):
        if t.startswith("##"):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _text(tokens, group):
    return "".join(tokens[i].removeprefix("##") for i in group)


def test_token_table_over_words_sums_the_tokens(pieces):
    _, _, out = pieces
    with aa.open_store(out) as s:
        e = s.get(0)
        assert e.tokens == ["[CLS]", "w1", "##a", "w2", "w3", "##b", "##c", "w4", "[SEP]"]
        ti = e.token_importance()
        df = e.to_pandas("tokens", aggregate="words")
        assert list(df.token) == WORDS_OF_0 and list(df.position) == list(range(6))
        want = [ti[0], ti[1] + ti[2], ti[3], ti[4] + ti[5] + ti[6], ti[7], ti[8]]
        np.testing.assert_allclose(df.importance, want, rtol=1e-5, atol=1e-7)
        assert df.importance.sum() == pytest.approx(ti.sum(), rel=1e-5)  # nothing lost or counted twice
        every = s.to_pandas("tokens", aggregate="words")
        assert len(every) == sum(len(_groups(s.get(i).tokens)) for i in s.indices)
        assert list(every[every.example == 0].token) == WORDS_OF_0
        assert list(s.to_pandas("tokens", aggregate="tokens").token[:9]) == e.tokens  # as scored
        spans = e.to_pandas("tokens", aggregate=[(3, 7)])  # a user span: w2 w3 ##b ##c
        assert len(spans) == 6 and spans.token[3] == "w2 w3bc"
        assert spans.importance[3] == pytest.approx(ti[3:7].sum(), rel=1e-5)
        with pytest.raises(OptionError, match="unknown aggregate 'letters'; use words or tokens"):
            s.to_pandas("tokens", aggregate="letters")
        with pytest.raises(OptionError, match="aggregate goes with table='tokens'"):
            s.to_pandas("heads", aggregate="words")


def test_triggers_are_words_whose_strength_sums_the_pieces(pieces, tmp_path):
    model_dir, data, out = pieces
    res = aa.triggers(out, aggregate="words")
    assert res.document["source"]["aggregate"] == "words"
    assert res.patterns and all("##" not in t for tr in res.triggers for t in tr.tokens)
    with Store(out) as s:
        for p in res.patterns:
            e = s.get(p.example)
            tokens, groups = list(e.tokens), _groups(list(e.tokens))
            a = np.asarray(e.attribution, np.float64)
            layers = list(e.layers)
            # the reference: every word-level entry summed over the pieces, between two different
            # real words; the top head's largest is the example's first pattern
            best = max((a[li, h][np.ix_(groups[q], groups[k])].sum(), li, h)
                       for li in range(a.shape[0]) for h in range(a.shape[1])
                       for q in range(1, len(groups) - 1) for k in range(1, len(groups) - 1) if q != k)
            li = layers.index(p.layer)
            assert p.value == pytest.approx(a[li, p.head][np.ix_(groups[p.query], groups[p.key])].sum(), rel=1e-5)
            first = next(x for x in res.patterns if x.example == p.example)
            assert first.value == pytest.approx(best[0], rel=1e-5) and (layers.index(first.layer), first.head) == best[1:]
            assert [t.token for t in p.tokens] == [_text(tokens, groups[g]) for g in sorted({p.query, p.key})]
            seg = [g for g in range(1, len(groups) - 1)]  # one segment: its words, special tokens aside
            assert all(t.length == len(seg) and t.offset == seg.index(t.position) for t in p.tokens)
    merged = {t for tr in res.triggers for t in tr.tokens}
    assert merged & {"w1a", "w3bc", "w6d", "w8e", "w10fg", "w12h"}  # words of several pieces among them
    # the command: words in the file; a word trigger is not inserted token by token
    trig = tmp_path / "t.json"
    r = run_cli("triggers", out, "--aggregate", "words", "--out", trig, "-q")
    assert r.exit_code == 0, r.output
    doc = json.loads(trig.read_text())
    assert [t["tokens"] for t in doc["triggers"]] == [t.tokens for t in res.triggers]
    one_error_line(run_cli("attack", "--model", model_dir, "--data", data, "--task", "sst2", "--triggers", trig,
                           "--out", tmp_path / "a.json"), "these triggers are words")
    one_error_line(run_cli("triggers", out, "--aggregate", "letters", "--out", trig), "unknown --aggregate 'letters'")
    with pytest.raises(OptionError, match="unknown aggregate 'letters'"):
        aa.triggers(out, aggregate="letters")


def test_faithfulness_over_words_ranks_and_erases_whole_words(pieces, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from attattr_cli.analysis.stats import kendall_tau_b

    model_dir, _, out = pieces
    methods = ["attention_last", "attr"]
    imp = tmp_path / "imp.h5"
    words = aa.faithfulness(out, methods=methods, permutations=0, aggregate="words", importance_store=imp)
    tokens = aa.faithfulness(imp, methods=methods, permutations=0)  # the same vectors, read back
    assert words.report["settings"]["aggregate"] == "words"
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()

    def p_target(ids, target):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), token_type_ids=torch.zeros(1, len(ids), dtype=torch.long)).logits
        return float(torch.softmax(logits.double(), -1)[0, target])

    with Store(imp) as s:
        for row, trow in zip(words.report["per_example"], tokens.report["per_example"]):
            e = s.get(row["index"])
            groups = _groups(list(e.tokens))
            content = list(range(1, len(groups) - 1))  # [CLS] and [SEP] aside
            assert row["n_words"] == len(groups) and row["n_content"] == len(content)
            vec = read_token_importance(s, row["index"])
            summed = {m: np.array([vec[m][g].sum() for g in groups]) for m in (*methods, "loo", "grad")}
            ids = [int(i) for i in e.input_ids]
            p0 = p_target(ids, row["target"])
            for m in methods:
                assert row["tau_loo"][m] == pytest.approx(kendall_tau_b(summed[m][content], summed["loo"][content]))
                assert row["tau_grad"][m] == pytest.approx(kendall_tau_b(summed[m][content], summed["grad"][content]))
                # the first bin (one word): the method's top word removed whole, every piece of it
                top = max(content, key=lambda g: (summed[m][g], -g))
                rest = [t for k, t in enumerate(ids) if k not in groups[top]]
                comp = row["erasure"][m]["comprehensiveness_bins"][0]
                assert comp == pytest.approx(p0 - p_target(rest, row["target"]), abs=1e-5)
                # nothing and everything removed: the same inputs whether words or tokens are counted
                curve, tcurve = row["erasure"][m]["deletion_curve"], trow["erasure"][m]["deletion_curve"]
                assert curve[0] == pytest.approx(tcurve[0]) and curve[-1] == pytest.approx(tcurve[-1])
    assert "n_words" not in tokens.report["per_example"][0]
    r = run_cli("faithfulness", imp, "--aggregate", "words", "--methods", "attention_last", "--permutations", "0",
                "--out", tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    assert "over words" in r.stderr
    assert json.loads((tmp_path / "f.json").read_text())["settings"]["aggregate"] == "words"
    one_error_line(run_cli("faithfulness", imp, "--aggregate", "letters", "--out", tmp_path / "g.json"),
                   "unknown --aggregate 'letters'")
    assert not (tmp_path / "g.json").exists()
