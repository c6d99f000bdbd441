"""Planted-pair ranking on hand-built maps, and the shipped default model's ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from attattr_cli.analysis.planted import planted_positions, planted_ranks, planted_recovery
from attattr_cli.engine.run import ScoreRequest, score_to_store
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.errors import StoreError
from attattr_cli.store import Store

SEG = np.array([-1, 0, 0, 0, -1, 1, 1, -1])  # [CLS] a b c [SEP] d e [SEP]
META = {"pair_word_index": [1, 0]}  # premise word b (pos 2), hypothesis word d (pos 5)


def test_positions_from_meta_and_from_tsv_text():
    assert planted_positions(SEG, META) == (2, 5)
    assert planted_positions(SEG, {"pair_word_index": "[1, 0]"}) == (2, 5)
    with pytest.raises(StoreError, match="no planted pair"):
        planted_positions(SEG, {})


def test_ranks_either_direction_ties_count_against():
    attr = np.zeros((2, 1, 8, 8))
    attr[0, 0, 5, 2] = 3.0  # hypothesis word as query, premise word as key: best entry
    attr[0, 0, 0, 0] = 1.0
    attr[1, 0, 0, 0] = 1.0  # layer 1: the pair scores 0 among 63 zeros
    assert planted_ranks(attr, SEG, META) == [1, 64]
    attr[0, 0, 2, 5] = 5.0
    attr[0, 0, 0, 1] = 9.0
    assert planted_ranks(attr, SEG, META)[0] == 2


def test_default_model_finds_the_planted_pairs(tmp_path):
    """The shipped model on the whole held-out set: the goal is >= 90 % in the top 5."""
    out = tmp_path / "planted.h5"
    report = score_to_store(ScoreRequest(out=str(out), options=ScoreOptions(steps=20), command=["test"]))
    assert report.accuracy >= 0.95
    with Store(out) as s:
        r = planted_recovery(s, top=5)
    assert r["examples"] == 200
    assert r["attribution"] >= 0.90
    assert r["attribution"] > r["attention"]
    from attattr_cli.analysis.stats import proportion_ci

    assert r["attribution_ci"] == pytest.approx(list(proportion_ci(round(r["attribution"] * 200), 200)))
    assert r["attribution_ci"][0] < r["attribution"] < r["attribution_ci"][1] or r["attribution"] == 1.0
    m = r["attribution_vs_attention"]
    assert m["difference"] == pytest.approx(r["attribution"] - r["attention"]) and m["p"] < 0.01
