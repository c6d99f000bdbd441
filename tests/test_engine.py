"""The fast path against the slow, paper-exact reference, and the engine's promises."""

from __future__ import annotations

import pytest
import torch

from attattr_cli.data.types import Example
from attattr_cli.engine import attention
from attattr_cli.engine.integrate import nodes
from attattr_cli.engine.scorer import Scorer
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.errors import DataError, OptionError
from slow_reference import slow_attribution

PAIR = Example(0, "w1 w2 w3 w4 w5", "w6 w7 w8", label=1)
SINGLE = Example(1, "w9 w10 w11 w12 w13 w14 w15", None, label=0)
FAMILIES = ["bert", "roberta", "electra", "distilbert", "gpt2", "llama"]


def _reference(scorer, result, example, rule="right", steps=8):
    enc = scorer.encode(example)
    inputs = {"input_ids": torch.tensor([enc.input_ids])}
    if enc.token_type_ids is not None:
        inputs["token_type_ids"] = torch.tensor([enc.token_type_ids])
    alphas, weights = nodes(rule, steps)
    return slow_attribution(scorer.model, inputs, result.layers, alphas, weights, result.target,
                            scorer.options.output)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kind", FAMILIES)
def test_fast_equals_slow_reference_float64(loaded_factory, kind):
    loaded = loaded_factory(kind, torch.float64)
    scorer = Scorer(loaded, ScoreOptions(steps=8, dtype="float64"))
    example = PAIR if kind != "gpt2" else SINGLE
    result = scorer.score(example)
    ref, f0 = _reference(scorer, result, example)
    for k, layer in enumerate(result.layers):
        fast = torch.from_numpy(result.attribution[k])
        assert fast.shape == ref[layer].shape
        assert _rel(fast, ref[layer]) < 1e-6, (kind, layer)
        assert result.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9)


@pytest.mark.parametrize("kind", ["bert", "roberta", "llama"])
def test_fast_equals_slow_reference_float32(loaded_factory, kind):
    loaded = loaded_factory(kind, torch.float32)
    scorer = Scorer(loaded, ScoreOptions(steps=8))
    result = scorer.score(PAIR)
    ref, _ = _reference(scorer, result, PAIR)
    for k, layer in enumerate(result.layers):
        assert _rel(torch.from_numpy(result.attribution[k]).double(), ref[layer].double()) < 2e-4


@pytest.mark.parametrize("rule", ["left", "gauss", "midpoint"])
def test_other_rules_match_reference(loaded_factory, rule):
    scorer = Scorer(loaded_factory("bert", torch.float64), ScoreOptions(steps=6, rule=rule, dtype="float64"))
    result = scorer.score(PAIR)
    ref, _ = _reference(scorer, result, PAIR, rule=rule, steps=6)
    for k, layer in enumerate(result.layers):
        assert _rel(torch.from_numpy(result.attribution[k]), ref[layer]) < 1e-6


@pytest.mark.parametrize("output", ["prob", "logit"])
def test_completeness_residual_shrinks_with_steps(loaded_factory, output):
    loaded = loaded_factory("bert", torch.float64)
    resid = []
    for m in (2, 8, 32):
        r = Scorer(loaded, ScoreOptions(steps=m, dtype="float64", output=output)).score(PAIR)
        resid.append(abs(r.residual).max())
    assert resid[0] > resid[1] > resid[2]
    assert resid[2] < 0.2 * resid[0]


def test_gauss_converges_faster_than_riemann(loaded_factory):
    loaded = loaded_factory("bert", torch.float64)
    right = Scorer(loaded, ScoreOptions(steps=8, dtype="float64")).score(PAIR)
    gauss = Scorer(loaded, ScoreOptions(steps=8, rule="gauss", dtype="float64")).score(PAIR)
    assert abs(gauss.residual).max() < abs(right.residual).max()


@pytest.mark.parametrize("step_batch", [1, 3, 5])
def test_any_step_chunking_gives_the_same_result(loaded_factory, step_batch):
    loaded = loaded_factory("llama", torch.float64)
    whole = Scorer(loaded, ScoreOptions(steps=8, dtype="float64")).score(PAIR)
    parts = Scorer(loaded, ScoreOptions(steps=8, dtype="float64", step_batch=step_batch)).score(PAIR)
    assert abs(whole.attribution - parts.attribution).max() < 1e-12
    assert abs(whole.residual - parts.residual).max() < 1e-12


def test_layer_subset_equals_full_run(loaded_factory):
    loaded = loaded_factory("bert", torch.float64)
    full = Scorer(loaded, ScoreOptions(steps=4, dtype="float64")).score(PAIR)
    part = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", layers=[2, 0])).score(PAIR)
    assert part.layers == [0, 2]
    assert abs(part.attribution - full.attribution[[0, 2]]).max() < 1e-12
    assert part.attention.shape == full.attention.shape  # attention probabilities kept for every layer


def test_result_is_real_length_and_attention_rows_sum_to_one(loaded_factory):
    scorer = Scorer(loaded_factory("bert"), ScoreOptions(steps=4))
    result = scorer.score(PAIR)
    n = len(result.tokens)
    assert n == 11  # [CLS] 5 [SEP] 3 [SEP]
    assert result.attribution.shape == (3, 4, n, n)
    assert result.attention.shape == (3, 4, n, n)
    assert abs(result.attention.sum(-1) - 1).max() < 1e-5
    assert list(result.segment_ids) == [-1, 0, 0, 0, 0, 0, -1, 1, 1, 1, -1]
    assert result.head_max.shape == (3, 4)
    assert (result.head_max == result.attribution.reshape(3, 4, -1).max(-1)).all()


def test_causal_attribution_is_zero_above_the_diagonal(loaded_factory):
    result = Scorer(loaded_factory("gpt2"), ScoreOptions(steps=4)).score(SINGLE)
    upper = torch.triu(torch.ones(len(result.tokens), len(result.tokens)), 1).bool().numpy()
    assert (result.attribution[:, :, upper] == 0).all()
    assert (result.attention[:, :, upper] == 0).all()


def test_targets(loaded_factory):
    loaded = loaded_factory("bert", torch.float64)
    pred = Scorer(loaded, ScoreOptions(steps=4, dtype="float64")).score(PAIR)
    gold = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="gold")).score(PAIR)
    named = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="LABEL_2")).score(PAIR)
    index = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="2")).score(PAIR)
    assert gold.target == 1
    assert named.target == index.target == 2
    assert abs(named.attribution - index.attribution).max() == 0
    assert pred.target == pred.pred
    with pytest.raises(OptionError, match="unknown target 'maybe'"):
        Scorer(loaded, ScoreOptions(target="maybe"))
    with pytest.raises(DataError, match="has no gold label"):
        Scorer(loaded, ScoreOptions(steps=2, target="gold")).score(Example(5, "w1 w2"))


def test_bad_options(loaded_factory):
    loaded = loaded_factory("bert")
    with pytest.raises(OptionError, match="layer 7 does not exist: the model has 3 layers"):
        Scorer(loaded, ScoreOptions(layers=[7]))
    with pytest.raises(OptionError, match="unknown rule 'simpson'"):
        Scorer(loaded, ScoreOptions(rule="simpson"))
    with pytest.raises(OptionError, match="--steps must be at least 1"):
        Scorer(loaded, ScoreOptions(steps=0))


def test_too_long_input_is_refused_or_truncated(loaded_factory):
    loaded = loaded_factory("bert")
    long = Example(9, " ".join(["w1"] * 60))
    with pytest.raises(DataError, match=r"example 9 has 62 tokens; the model takes at most 48 \(pass --truncate"):
        Scorer(loaded, ScoreOptions(steps=2)).encode(long)
    enc = Scorer(loaded, ScoreOptions(steps=2, truncate=True)).encode(long)
    assert len(enc.input_ids) == 48 and enc.truncated


def test_attention_implementation_restored_after_exception(loaded_factory):
    loaded = loaded_factory("gpt2")
    model = loaded.model
    before = model.config._attn_implementation
    pad_before = model.config.pad_token_id
    scorer = Scorer(loaded, ScoreOptions(steps=4))
    from attattr_cli.models.arch import find_layers

    layers = find_layers(model)[1]
    calls = {"n": 0}

    def boom(module, args, output):
        calls["n"] += 1
        if calls["n"] == 3:  # an integration pass (a sweep: F(0) of every layer, the rule lacking alpha = 0)
            raise RuntimeError("boom")

    handle = layers[2].register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            scorer.score(SINGLE)
    finally:
        handle.remove()
    assert model.config._attn_implementation == before
    assert model.config.pad_token_id == pad_before
    assert all("forward" not in vars(layer) for layer in layers)
    assert attention._plan.get() is None and attention._owner.get() is None
    # and the model still works normally afterwards
    again = scorer.score(SINGLE)
    assert again.attribution.shape[0] == 3
