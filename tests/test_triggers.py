"""Triggers and attacks: extraction on hand-built attribution, insertion, truncation, CLI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from attattr_cli.analysis.attack import (
    Framed,
    Insertion,
    attack_example,
    clean_variant,
    from_document,
    insert_into_segment,
    make_controls,
    parse_position,
)
from attattr_cli.analysis.triggers import (
    aggregate,
    example_patterns,
    load_triggers,
    select,
    triggers_csv,
    triggers_document,
)
from attattr_cli.errors import DataError, OptionError
from conftest import one_error_line, run_cli



# ----------------------------------------------------------------------------- insertion


def test_relative_positions_and_edges():
    seg = list("abcde")  # L = 5
    out, mask = insert_into_segment(seg, [("X", 0.0, 0.2)])
    assert out == list("Xabcde") and mask == [True] + [False] * 5
    out, _ = insert_into_segment(seg, [("X", 1.0, 1.0)])
    assert out == list("abcdeX")  # the last token of its segment goes last
    out, _ = insert_into_segment(seg, [("X", 0.5, 0.6)])
    assert out == list("abcXde")  # round(0.5 * 5) = 3 (half up): before token 3
    # out of range relative positions are clamped at the edges
    assert insert_into_segment(seg, [("X", -0.3, 0.0)])[0][0] == "X"
    assert insert_into_segment(seg, [("X", 1.7, 1.0)])[0][-1] == "X"
    # two tokens at the same place keep their order; empty segment
    out, mask = insert_into_segment(seg, [("X", 0.4, 0.0), ("Y", 0.4, 0.0)])
    assert out == list("abXYcde") and mask == [False, False, True, True, False, False, False]
    assert insert_into_segment([], [("X", 0.7, 0.5)])[0] == ["X"]
    assert insert_into_segment(seg, [("X", 0.5, 0.5)], "start")[0][0] == "X"
    assert insert_into_segment(seg, [("X", 0.0, 0.5)], "end")[0][-1] == "X"
    assert insert_into_segment(seg, [("X", 0.0, 0.5)], 0.2)[0] == list("aXbcde")


def test_reference_position_rule():
    # the 2021 code: k-th of c tokens at round((L + c) * ref), one further on a collision
    seg = list("abcdefgh")  # L = 8
    out, _ = insert_into_segment(seg, [("X", 0.0, 0.25), ("Y", 0.0, 0.25)], "reference")
    # X at round(10 * .25) = 3 (half up); Y collides -> 4
    assert out == list("abcXYdefgh")
    out, _ = insert_into_segment(seg, [("X", 0.0, 1.0)], "reference")
    assert out == list("abcdefghX")


def test_bad_position():
    with pytest.raises(OptionError, match="unknown --position"):
        parse_position("middle")
    with pytest.raises(OptionError, match="outside"):
        parse_position("1.5")


def _pair():
    # [CLS] a0 a1 a2 a3 [SEP] b0 b1 b2 [SEP]
    ids = [2, 10, 11, 12, 13, 3, 20, 21, 22, 3]
    seq = [-1, 0, 0, 0, 0, -1, 1, 1, 1, -1]
    types = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    return Framed(ids, seq, types)


def test_insertion_in_both_segments():
    v = attack_example(_pair(), [98, 99], [0, 1], [1.0, 0.0])
    assert v.ids == [2, 10, 11, 12, 13, 98, 3, 99, 20, 21, 22, 3]
    assert v.types == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert [i for i, t in zip(v.ids, v.is_trigger) if t] == [98, 99]
    assert not v.truncated
    v = attack_example(_pair(), [98, 99], [1, 1], [0.5, 0.5])
    assert v.ids == [2, 10, 11, 12, 13, 3, 20, 21, 98, 99, 22, 3]


def test_truncation_cuts_the_example_never_the_trigger():
    f = _pair()
    v = attack_example(f, [98, 99], [0, 1], [0.0, 1.0], max_length=10)
    assert v.truncated and len(v.ids) == 10
    assert 98 in v.ids and 99 in v.ids
    # the longer segment (a: 4 own tokens vs 3) loses its last own token; then a tie: a again
    assert v.ids == [2, 98, 10, 11, 3, 20, 21, 22, 99, 3]
    assert len(v.types) == len(v.ids) == len(v.seq) == len(v.is_trigger)
    with pytest.raises(DataError, match="trigger and the special tokens alone"):
        attack_example(f, [98, 99, 97], [0, 0, 1], [0.0, 1.0, 0.5], max_length=5)
    # the clean example is cut the same way when it is too long
    assert clean_variant(f, 8).truncated and len(clean_variant(f, 8).ids) == 8
    assert not clean_variant(f, None).truncated


def test_controls_are_seeded_and_exclude_triggers():
    t = [Insertion("T1", "trigger", ["good", "bad"], [0, 1], [0.1, 0.9], [0.2, 1.0], "positive")]
    vocab = ["x", "y", "z", "w"]
    a = make_controls(t, vocab, 3, seed=5)
    b = make_controls(t, vocab, 3, seed=5)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert all(len(c.tokens) == 2 and set(c.tokens) <= set(vocab) for c in a)
    assert all(c.segments == [0, 1] and c.relative == [0.1, 0.9] and c.mirrors == "T1" for c in a)


# ----------------------------------------------------------------------------- extraction


def _hand_attr():
    # tokens: [CLS] p0 p1 [SEP] h0 h1 [SEP]; 2 layers, 2 heads
    tokens = ["[CLS]", "blick", "seka", "[SEP]", "kiki", "paru", "[SEP]"]
    seg = [-1, 0, 0, -1, 1, 1, -1]
    a = np.zeros((2, 2, 7, 7))
    a[0, 0, 4, 1] = 0.5  # layer 0 best: 0.5
    a[1, 1, 0, 2] = 0.9  # layer 1, head 1: [CLS] -> seka is the largest entry of all
    a[1, 1, 4, 1] = 0.8  # kiki -> blick
    a[1, 1, 5, 2] = 0.3  # paru -> seka
    a[1, 1, 2, 2] = 0.85  # diagonal
    return a, tokens, seg


def test_patterns_of_the_top_head():
    a, tokens, seg = _hand_attr()
    pats = example_patterns(a, tokens, seg, [0, 1], example=7, target=2, pred=2, gold=0)
    assert [(p.layer, p.head, p.query, p.key) for p in pats] == [(1, 1, 4, 1), (1, 1, 5, 2)]
    first = pats[0]
    assert first.value == pytest.approx(0.8) and first.example == 7 and first.target == 2
    assert [(t.token, t.segment, t.offset, t.length) for t in first.tokens] == [("blick", 0, 0, 2), ("kiki", 1, 0, 2)]
    assert first.tokens[0].relative == 0.0 and first.tokens[1].reference == 0.5
    # the 2021 way: every entry counts; [CLS] -> seka keeps only seka, then the diagonal
    ref = example_patterns(a, tokens, seg, [0, 1], special=True)
    assert [(p.query, p.key) for p in ref] == [(0, 2), (2, 2)]
    assert [t.token for t in ref[0].tokens] == ["seka"] and [t.token for t in ref[1].tokens] == ["seka"]
    # scored layers are named by the store's layer numbers
    assert example_patterns(a, tokens, seg, [3, 5])[0].layer == 5


def test_aggregation_and_ranking():
    a, tokens, seg = _hand_attr()
    labels = ["entailment", "neutral", "contradiction"]
    pats = []
    for k, target in enumerate([2, 2, 0]):
        pats += example_patterns(a * (k + 1), tokens, seg, [0, 1], example=k, target=target)
    b = np.zeros_like(a)
    b[0, 1, 5, 1] = 2.0  # one strong, single pattern: paru -> blick
    b[0, 1, 4, 2] = 0.1
    pats += example_patterns(b, tokens, seg, [0, 1], example=9, target=1)
    ranked = aggregate(pats, labels)
    top = ranked[0]
    assert top.tokens == ["blick", "kiki"] and top.segments == [0, 1] and top.count == 3
    assert top.mean_strength == pytest.approx(0.8 * (1 + 2 + 3) / 3)
    assert top.classes == {"contradiction": 2, "entailment": 1} and top.label == "contradiction"
    assert top.examples == [0, 1, 2] and top.rank == 1
    by_total = aggregate(pats, labels, rank_by="total")
    assert by_total[0].tokens == ["blick", "kiki"]  # 0.8 * 6 = 4.8 > 2.0
    by_mean = aggregate(pats, labels, rank_by="mean")
    assert by_mean[0].tokens == ["blick", "paru"] and by_mean[0].count == 1
    per = select(ranked, 1, True, labels)
    assert [t.label for t in per] == ["neutral", "contradiction"]
    doc = triggers_document(per, label_names=labels, per_class=True, top=1, rank_by="count", source={}, patterns=pats)
    assert doc["examples"] == 4 and doc["patterns"] == 8
    csv_text = triggers_csv(ranked)
    assert csv_text.splitlines()[0].startswith("rank,class,class_rank,tokens")
    assert "blick kiki" in csv_text.splitlines()[1]
    chosen = from_document(json.loads(json.dumps(doc)), top=1)
    assert [c.tokens for c in chosen] == [["blick", "paru"], ["blick", "kiki"]]


def test_bad_triggers_file(tmp_path):
    p = tmp_path / "t.json"
    with pytest.raises(OptionError, match="no such triggers file"):
        load_triggers(p)
    p.write_text("{}")
    with pytest.raises(OptionError, match="not an attattr triggers file"):
        load_triggers(p)


# ----------------------------------------------------------------------------- CLI


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_cli_builtin_default_end_to_end(tmp_path):
    trig = tmp_path / "t.json"
    r = run_cli("triggers", "--out", trig, "--examples", "0:24", "--steps", "4", "--top", "4", "--csv", tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(trig)
    doc = json.loads(trig.read_text())
    assert doc["format"] == "attattr.triggers" and doc["examples"] == 24 and len(doc["triggers"]) == 4
    assert doc["source"]["model"] == "attattr/synthetic-nli-bert"
    assert all(len(t["tokens"]) == len(t["segments"]) == len(t["relative"]) for t in doc["triggers"])
    assert (tmp_path / "t.csv").read_text().count("\n") == 5
    res = tmp_path / "a.json"
    texts = tmp_path / "texts.jsonl"
    r = run_cli("attack", "--triggers", trig, "--examples", "0:30", "--top", "2", "--controls", "2", "--out", res,
                "--save-texts", texts)
    assert r.exit_code == 0, r.output
    assert "accuracy (%) per gold class" in r.stderr and "control" in r.stderr
    out = json.loads(res.read_text())
    layouts = {(len(t["tokens"]), tuple(t["segments"])) for t in out["triggers"]}
    assert out["examples"] == 30 and len(out["triggers"]) == 2 and len(out["controls"]) == 2 * len(layouts)
    assert out["controls_per_layout"] == 2 and "most damaging" in r.stderr and "Holm-adjusted" in r.stderr
    assert all(row["beats_controls"] in (True, False) and 0 < row["p_holm"] <= 1
               for row in out["table"] if row["trigger_count"])
    assert [row["class"] for row in out["table"]] == ["entailment", "neutral", "contradiction"]
    assert sum(row["n"] for row in out["table"]) == 30
    lines = [json.loads(l) for l in texts.read_text().splitlines()]
    assert len(lines) == (2 + len(out["controls"])) * 30
    first = lines[0]
    tokens = out["triggers"][0]["tokens"]
    segs = out["triggers"][0]["segments"]
    for tok, s in zip(tokens, segs):
        assert tok in (first["text_a"] if s == 0 else first["text_b"]).split()
    # a store as input gives the same triggers as scoring on the fly
    store = tmp_path / "s.h5"
    assert run_cli("score", "--out", store, "--examples", "0:24", "--steps", "4", "-q").exit_code == 0
    r = run_cli("triggers", store, "--out", tmp_path / "t2.json", "--top", "4", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t2.json").read_text())["triggers"] == doc["triggers"]
    # scoring on the fly into a kept store reads only the selected examples back
    r = run_cli("triggers", "--store", store, "--examples", "0:10", "--steps", "4", "--out", tmp_path / "t3.json", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t3.json").read_text())["examples"] == 10


def test_cli_data_file_untouched_and_errors(tmp_path):
    data = tmp_path / "syn.tsv"
    assert run_cli("demo", "data", "--out", data, "--count", "12").exit_code == 0
    digest = _sha(data)
    trig = tmp_path / "t.json"
    r = run_cli("triggers", "--data", data, "--task", "synthetic", "--steps", "3", "--out", trig, "-q")
    assert r.exit_code == 0, r.output
    res = tmp_path / "a.json"
    r = run_cli("attack", "--data", data, "--task", "synthetic", "--triggers", trig, "--out", res, "-q")
    assert r.exit_code == 0, r.output
    assert _sha(data) == digest
    before = res.read_bytes()
    one_error_line(run_cli("attack", "--triggers", tmp_path / "none.json", "--out", res), "no such triggers file")
    one_error_line(run_cli("attack", "--triggers", trig, "--out", res, "--position", "middle"), "unknown --position")
    one_error_line(run_cli("triggers", tmp_path / "s.h5", "--model", "x", "--out", trig), "not both")
    one_error_line(run_cli("triggers", tmp_path / "missing.h5", "--out", trig), "no such store")
    as_csv = tmp_path / "t.csv"
    r = run_cli("triggers", "--data", data, "--task", "synthetic", "--steps", "3", "--out", as_csv, "--top", "2", "-q")
    assert r.exit_code == 0, r.output
    assert as_csv.read_text().startswith("rank,class,class_rank,tokens") and as_csv.read_text().count("\n") == 3
    assert res.read_bytes() == before  # a failed run leaves earlier output as it was


def test_cli_single_sentence(tmp_path, tiny_model_dir, sst2_small):
    trig = tmp_path / "t.json"
    r = run_cli("triggers", "--model", tiny_model_dir, "--data", sst2_small, "--task", "sst2", "--steps", "3",
                "--min-tokens", "7", "--per-class", "--top", "2", "--out", trig, "-q")
    assert r.exit_code == 0, r.output
    doc = json.loads(trig.read_text())
    assert doc["per_class"] and all(set(t["segments"]) == {0} for t in doc["triggers"])
    assert doc["examples"] == 5  # rows of 4 + i % 3 words: the three of 4 words (6 tokens) are skipped
    digest = _sha(sst2_small)
    res = tmp_path / "a.json"
    r = run_cli("attack", "--model", tiny_model_dir, "--data", sst2_small, "--task", "sst2", "--triggers", trig,
                "--out", res, "-q")
    assert r.exit_code == 0, r.output
    assert _sha(sst2_small) == digest
    out = json.loads(res.read_text())
    assert [row["class"] for row in out["table"]] == ["negative", "positive"]
    # a pair trigger cannot go into one-segment data
    doc["triggers"][0]["segments"] = [1] * len(doc["triggers"][0]["segments"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    one_error_line(run_cli("attack", "--model", tiny_model_dir, "--data", sst2_small, "--task", "sst2",
                           "--triggers", bad, "--out", res), "the data has 1 segment")
    # triggers of another model's vocabulary are refused
    doc["triggers"][0]["segments"] = [0] * len(doc["triggers"][0]["segments"])
    doc["triggers"][0]["tokens"] = ["blick"] * len(doc["triggers"][0]["tokens"])
    bad.write_text(json.dumps(doc))
    one_error_line(run_cli("attack", "--model", tiny_model_dir, "--data", sst2_small, "--task", "sst2",
                           "--triggers", bad, "--out", res), "'blick' is not in the model's vocabulary")



# ----------------------------------------------------------------------------- the control distribution


def _planted_pair(name, p, q, label):
    return Insertion(name=name, kind="trigger", tokens=[p, q], segments=[0, 1], relative=[0.5, 0.5],
                     reference=[0.5, 0.5], label=label)


def test_attack_control_distribution_on_the_builtin_default():
    import attattr_cli as aa
    from attattr_cli.data import synthetic as syn

    labels = syn.LABELS
    # planted key-word pairs: three deciding entailment, three contradiction (a neutral pair
    # is only the absence of a relation, inserted beside the example's own pair it decides little)
    pairs = [(0, 0), (1, 1), (2, 2), (3, syn.SIGMA[3]), (4, syn.SIGMA[4]), (5, syn.SIGMA[5])]
    planted = [_planted_pair(f"T{k + 1}", syn.PREMISE_WORDS[i], syn.HYPOTHESIS_WORDS[j], labels[syn.label_of(i, j)])
               for k, (i, j) in enumerate(pairs)]
    model = aa.load_model()
    res = aa.attack(model, planted, examples="0:30", controls=20, seed=3)
    doc = res.document
    assert doc["controls_per_layout"] == 20 and len(doc["controls"]) == 20  # one layout
    for row in doc["table"]:
        # 3 planted triggers of the other classes against 20 controls: C(23, 3) = 1771 splits, exact;
        # 6 (the neutral class): C(26, 6) splits, Monte-Carlo
        assert row["p_exact"] == (row["trigger_count"] == 3)
        assert row["p"] < 0.01 and row["beats_controls"], row
        assert row["control_count"] == 20 and row["control_sd"] is not None
        worst = row["worst_control"]
        assert worst["accuracy"] == min(c["accuracy"][row["class"]] for c in doc["controls"])
    n_before = {c: v["correct"] for c, v in doc["before"].items()}
    n_class = {c: v["n"] for c, v in doc["before"].items()}

    def drop(row, target):  # on the examples of the other classes, from the per-class counts
        others = [c for c in labels if c != target]
        n = sum(n_class[c] for c in others)
        return (sum(n_before[c] for c in others) - sum(row["correct"][c] for c in others)) / n

    top = 0
    for t in doc["triggers"]:
        null = [drop(c, t["class"]) for c in doc["controls"]]
        assert t["controls"]["n"] == 20 and t["drop"] == pytest.approx(drop(t, t["class"]))
        assert t["p"] == pytest.approx((1 + sum(x >= t["drop"] - 1e-12 for x in null)) / 21)
        top += t["p"] == pytest.approx(1 / 21)  # above every control: the smallest possible
    assert top >= 4
    # seeded: the same controls and the same tests again
    again = aa.attack(model, planted, examples="0:30", controls=20, seed=3).document
    assert again["table"] == doc["table"] and again["controls"] == doc["controls"]

    # random "triggers" (distractor words, which decide no label) do not beat the controls
    import random

    rng = random.Random(5)
    fake = [_planted_pair(f"T{k + 1}", *rng.sample(syn.DISTRACTORS, 2), labels[k % 3]) for k in range(6)]
    doc = aa.attack(model, fake, examples="0:30", controls=20, seed=3).document
    for row in doc["table"]:
        assert row["p"] >= 0.01 and not row["beats_controls"], row
    assert all(t["p"] > 0.01 for t in doc["triggers"])


def test_attack_variants_in_shared_batches_predict_as_one_at_a_time():
    """Every insertion's variants run together in padded batches: the predictions (and so
    every count, accuracy and test) of one variant per pass."""
    import attattr_cli as aa
    from attattr_cli.analysis.attack import run_attack
    from attattr_cli.api.inputs import model_and_data
    from attattr_cli.data import synthetic as syn

    model = aa.load_model(dtype="float64")
    _, _, examples, _, _, labels = model_and_data(model, None, None, "0:24", None, device="cpu")
    planted = [_planted_pair(f"T{k + 1}", syn.PREMISE_WORDS[k], syn.HYPOTHESIS_WORDS[k], syn.LABELS[syn.label_of(k, k)])
               for k in range(3)]
    docs = [run_attack(model.loaded, examples, labels, planted, controls=4, seed=1, batch_size=b, keep_texts=True)
            for b in (64, 1)]
    assert len(docs[0]["texts"]) == 24 * (3 + 4)
    for key in ("before", "triggers", "controls", "table", "texts"):
        assert docs[0][key] == docs[1][key], key
