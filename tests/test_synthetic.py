"""The built-in synthetic pair task and the committed default model trained on it."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest

from attattr_cli.data import synthetic as syn
from attattr_cli.data.types import Example
from attattr_cli.errors import DataError
from attattr_cli.models.default import DEFAULT_MODEL_DIR, DEFAULT_MODEL_ID, train_default_model

# ---------------------------------------------------------------- generator


def test_labels_and_constants():
    assert syn.LABELS == ("entailment", "neutral", "contradiction")
    assert syn.TRAIN_SEED != syn.HELDOUT_SEED
    words = syn.vocabulary()
    assert len(words) == len(set(words))
    assert len(syn.DISTRACTORS) >= 50
    keys = set(syn.PREMISE_WORDS) | set(syn.HYPOTHESIS_WORDS)
    assert not keys & set(syn.DISTRACTORS)
    assert all(syn.SIGMA[i] != i for i in range(len(syn.SIGMA)))


def test_deterministic():
    a = syn.generate(60, seed=3)
    b = syn.generate(60, seed=3)
    assert a == b
    assert syn.generate(60, seed=4) != a
    assert syn.heldout() == syn.heldout()
    assert len(syn.heldout()) == 200
    assert syn.heldout(10) == syn.heldout()[:10]
    assert [ex.text_a for ex in syn.heldout(50)] != [ex.text_a for ex in syn.train_set(50)]


def test_indices_and_types():
    exs = syn.generate(5, seed=1, start_index=10)
    assert [ex.index for ex in exs] == [10, 11, 12, 13, 14]
    assert all(isinstance(ex, Example) and isinstance(ex.label, int) for ex in exs)
    assert syn.generate(0, seed=1) == []
    with pytest.raises(ValueError):
        syn.generate(-1, seed=1)


def test_golden_first_heldout_example():
    # stores reference the default data by index: the held-out set must never drift
    ex = syn.heldout()[0]
    assert ex.text_a == "paru fepple mabu yuke lapi hime lume hoka mosa wabo"
    assert ex.text_b == "duna vola pesa fipo hapa kaze lume vashu tivo"
    assert ex.label == syn.LABELS.index("neutral")
    assert ex.meta == {"pair": ["fepple", "vashu"], "pair_word_index": [1, 7]}


def test_label_balance_in_every_prefix():
    exs = syn.generate(301, seed=5)
    counts = Counter()
    for ex in exs:
        counts[ex.label] += 1
        assert max(counts.values()) - min(counts[k] for k in range(3)) <= 1
    assert sorted(counts.values()) == [100, 100, 101]
    assert syn.generate(100, seed=5) == exs[:100]


def test_label_is_decided_by_the_pair_not_by_either_word():
    exs = syn.generate(3000, seed=11)
    by_pair: dict[tuple[str, str], set[int]] = {}
    by_p: dict[str, Counter] = {}
    by_q: dict[str, Counter] = {}
    for ex in exs:
        p, q = ex.meta["pair"]
        by_pair.setdefault((p, q), set()).add(ex.label)
        by_p.setdefault(p, Counter())[ex.label] += 1
        by_q.setdefault(q, Counter())[ex.label] += 1
        assert ex.label == syn.label_of(syn.PREMISE_WORDS.index(p), syn.HYPOTHESIS_WORDS.index(q))
    # the pair is a function of the label ...
    assert all(len(labels) == 1 for labels in by_pair.values())
    assert len(by_pair) == 36  # every combination occurs
    # ... and each word alone says (almost) nothing: every label, about a third each
    for table in (by_p, by_q):
        assert len(table) == 6
        for counts in table.values():
            total = sum(counts.values())
            assert set(counts) == {0, 1, 2}
            assert all(0.25 < c / total < 0.42 for c in counts.values()), counts


def test_meta_points_at_the_planted_words():
    for ex in syn.heldout() + syn.train_set(200):
        p, q = ex.meta["pair"]
        i, j = ex.meta["pair_word_index"]
        a, b = ex.text_a.split(), ex.text_b.split()
        assert a[i] == p and b[j] == q
        assert p in syn.PREMISE_WORDS and q in syn.HYPOTHESIS_WORDS
        # the key word is the only key word of either kind in the example
        keys = set(syn.PREMISE_WORDS) | set(syn.HYPOTHESIS_WORDS)
        assert [w for w in a if w in keys] == [p]
        assert [w for w in b if w in keys] == [q]
        json.dumps(ex.meta)


def test_standard_lengths():
    for ex in syn.heldout():
        assert 5 <= len(ex.text_a.split()) - 1 <= 12
        assert 3 <= len(ex.text_b.split()) - 1 <= 8


def test_write_tsv(tmp_path):
    exs = syn.generate(7, seed=2)
    path = tmp_path / "syn.tsv"
    syn.write(path, exs)
    with path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert list(rows[0]) == ["premise", "hypothesis", "label", "pair", "pair_word_index"]
    assert len(rows) == 7
    for row, ex in zip(rows, exs):
        assert row["premise"] == ex.text_a and row["hypothesis"] == ex.text_b
        assert row["label"] == syn.LABELS[ex.label]
        assert json.loads(row["pair"]) == ex.meta["pair"]
        assert json.loads(row["pair_word_index"]) == ex.meta["pair_word_index"]
    with pytest.raises(DataError):
        syn.write(tmp_path / "no" / "such" / "dir.tsv", exs)


# ---------------------------------------------------------------- default model


def _accuracy(model, tokenizer, examples):
    import torch

    enc = tokenizer(
        [ex.text_a for ex in examples], [ex.text_b for ex in examples], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1)
    return (pred == torch.tensor([ex.label for ex in examples])).float().mean().item()


def test_default_model_loads_with_plain_transformers_and_is_accurate():
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert DEFAULT_MODEL_ID == "attattr/synthetic-nli-bert"
    assert (DEFAULT_MODEL_DIR / "config.json").is_file()
    assert (DEFAULT_MODEL_DIR / "model.safetensors").is_file()
    size = sum(f.stat().st_size for f in DEFAULT_MODEL_DIR.iterdir())
    assert size < 5_000_000

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    model = AutoModelForSequenceClassification.from_pretrained(DEFAULT_MODEL_DIR).eval()
    assert model.config.id2label == dict(enumerate(syn.LABELS))
    assert model.config.label2id == {name: i for i, name in enumerate(syn.LABELS)}

    # every task word is one whole token
    for word in syn.vocabulary():
        assert tokenizer.tokenize(word) == [word]
        assert tokenizer.tokenize(word.upper()) == [word]  # lower-casing tokenizer

    assert _accuracy(model, tokenizer, syn.heldout()) >= 0.95


def test_training_smoke(tmp_path, capfd):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    calls = []
    metrics = train_default_model(
        tmp_path / "m", seed=1, train_size=96, epochs=1, progress=lambda s, t, i: calls.append((s, t, i))
    )
    out, err = capfd.readouterr()
    assert "Writing model shards" not in out + err  # the library draws no bars
    assert out == ""

    assert set(metrics) >= {"heldout_accuracy", "train_seconds", "n_params"}
    assert 0.0 <= metrics["heldout_accuracy"] <= 1.0
    assert metrics["n_params"] > 0 and metrics["train_seconds"] > 0
    assert [c[0] for c in calls[:-1]] == [1, 2, 3]
    assert all(c[1] == 3 for c in calls)
    assert "loss" in calls[0][2] and "heldout_accuracy" in calls[-1][2]

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert model.config.num_labels == 3
    assert tokenizer.tokenize(syn.PREMISE_WORDS[0]) == [syn.PREMISE_WORDS[0]]


def test_training_is_deterministic(tmp_path):
    import torch
    from safetensors.torch import load_file

    a = train_default_model(tmp_path / "a", seed=2, train_size=64, epochs=1)
    b = train_default_model(tmp_path / "b", seed=2, train_size=64, epochs=1)
    assert a["final_loss"] == b["final_loss"]
    wa = load_file(tmp_path / "a" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
