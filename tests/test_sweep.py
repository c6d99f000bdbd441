"""Sweeps (engine/sweep.py: every target layer's passes of a round in one batch through the
stack) give the numbers of one pass per target layer, up to float rounding, for fixed rules
and --tol, encoders and decoders, classifiers and language models; and a model whose layers
cannot sweep falls back to per-layer passes with the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attattr_cli.data.types import Example
from attattr_cli.engine import adaptive, attention, sweep
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.run import scorer_for
from attattr_cli.engine.scorer import Scorer
from attattr_cli.models.loading import prepare
from arch_matrix import build

TEXT = "w1 w2 w3 w4 w5 w6"


def _score(model, tokenizer, lm, swept: bool, **options):
    loaded = prepare(model, tokenizer, "tiny", lm=lm)
    scorer = Scorer(loaded, ScoreOptions(dtype="float64", lm=lm, group=1, **options))
    scorer.sweep = swept
    passes = []
    original, step = sweep._pass, Scorer._step_chunk

    def counted(*a, **k):
        passes.append(1)
        return original(*a, **k)

    def counted_step(self, *a, **k):
        passes.append(1)
        return step(self, *a, **k)

    sweep._pass, Scorer._step_chunk = counted, counted_step
    try:
        result = scorer.score(Example(0, TEXT))
    finally:
        sweep._pass, Scorer._step_chunk = original, step
    return result, len(passes)


def _same(a, b, rel=1e-9):
    for fam in a.families:
        fa, fb = a.families[fam], b.families[fam]
        for k in range(len(fa.layers)):
            x, y = fa.attribution[k], fb.attribution[k]
            assert np.abs(x - y).max() <= rel * max(np.abs(y).max(), 1e-300), (fam, k)
        assert np.array_equal(fa.nodes, fb.nodes)
        assert np.array_equal(fa.status, fb.status)
    np.testing.assert_allclose(a.residual, b.residual, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("model_type", ["llama", "bert", "gpt2", "gemma2", "qwen2", "phi3"])
@pytest.mark.parametrize("options", [dict(steps=6, rule="right"), dict(steps=5, rule="gauss"), dict(tol=0.05)],
                         ids=["right", "gauss", "tol"])
def test_sweeps_give_the_per_layer_numbers(model_type, options, tokenizer):
    model, lm = build(model_type, torch.float64)
    swept, passes = _score(model, tokenizer, lm, True, **options)
    layered, layer_passes = _score(model, tokenizer, lm, False, **options)
    _same(swept, layered)
    # one sweep per round (a fixed rule: one round, and F(0) one more where the rule lacks
    # alpha = 0, counted here for sweeps only) against one pass per layer and round
    assert 0 < passes <= layer_passes
    if "tol" in options:
        assert passes < layer_passes


def test_a_layer_that_cannot_sweep_falls_back(tokenizer, monkeypatch):
    model, lm = build("llama", torch.float64)
    layered, _ = _score(model, tokenizer, lm, False, tol=0.1)

    def refuse(*a, **k):
        raise attention.NotSweepable("test")

    monkeypatch.setattr(sweep, "_pass", refuse)
    loaded = prepare(model, tokenizer, "tiny", lm=lm)
    scorer = Scorer(loaded, ScoreOptions(dtype="float64", lm=lm, group=1, tol=0.1))
    got = scorer.score(Example(0, TEXT))
    _same(got, layered)
    assert scorer.sweeps_work is False


def test_sweeps_converge_like_layers_under_the_completeness_axiom(tokenizer):
    model, lm = build("llama", torch.float64)
    result, _ = _score(model, tokenizer, lm, True, tol=1e-3)
    fam = result.families["self"]
    assert all(int(s) == adaptive.CONVERGED for s in fam.status)
    for k in range(len(fam.layers)):  # sum Attr = F(A) - F(0), to the tolerance's scale
        effect = result.f_full - fam.f0[k] if hasattr(fam, "f0") else None
        assert abs(result.residual[k]) <= 1e-3 * max(abs(effect or 0.0), np.abs(fam.attribution[k]).max())


def test_progress_tells_each_layer_once_as_it_is_done(tokenizer):
    model, lm = build("llama", torch.float64)
    loaded = prepare(model, tokenizer, "tiny", lm=lm)
    for options in (dict(tol=0.05), dict(steps=4, rule="gauss")):
        scorer = Scorer(loaded, ScoreOptions(dtype="float64", lm=lm, group=1, **options))
        ticks = []
        result = scorer.score(Example(0, TEXT), on_layer=ticks.append)
        assert sorted(ticks) == list(result.layers)


@pytest.mark.parametrize("options", [dict(steps=5, rule="gauss"), dict(steps=4, rule="right"), dict(tol=0.05)],
                         ids=["gauss", "right", "tol"])
def test_a_generation_by_sweeps_gives_the_per_layer_numbers(options, tokenizer):
    from conftest import build_model

    loaded = prepare(build_model("llama", dtype=torch.float64, lm=True), tokenizer, "tiny", lm=True)
    got = {}
    for swept in (True, False):
        scorer = scorer_for(loaded, ScoreOptions(dtype="float64", lm=True, generate=3, group=1, **options))
        scorer.sweep = swept
        got[swept] = scorer.score(Example(0, "w1 w2 w3 w4"))
    assert len(got[True].steps) == len(got[False].steps) == 3
    for a, b in zip(got[True].steps, got[False].steps):
        for k in range(len(a.family.layers)):
            x, y = a.family.attribution[k], b.family.attribution[k]
            assert np.abs(x - y).max() <= 1e-9 * np.abs(y).max()
        assert np.array_equal(a.family.nodes, b.family.nodes) and np.array_equal(a.family.status, b.family.status)
    _same(got[True], got[False])


def test_sweeps_reach_further_on_a_cuda_device():
    """Past MAX_TOKENS a CPU pass is full already; a GPU's is not until CUDA_MAX_TOKENS."""
    assert sweep.max_tokens(torch.device("cpu")) == sweep.MAX_TOKENS == 256
    assert sweep.max_tokens(torch.device("cuda")) == sweep.CUDA_MAX_TOKENS > sweep.MAX_TOKENS


def test_results_reach_the_host_unchanged():
    from attattr_cli.engine.memory import to_host

    t = torch.randn(4, 5).t()
    assert torch.equal(to_host(t), t)
