"""Sweeps (engine/sweep.py: every target layer's passes of a round in one batch through the
stack) give the numbers of one pass per target layer, up to float rounding, for fixed rules
and --tol, encoders and decoders, classifiers and language models; and a model whose layers
cannot sweep falls back to per-layer passes with the same numbers."""

from __future__ import annotations

import re

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
from conftest import build_model

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


# -- issue 53: a pass never waits for the device ------------------------------------------
def _counted_score(model, tokenizer, lm, swept: bool, **options):
    """The example scored under an OpCounter, the passes (sweep._pass, Scorer._step_chunk)
    as its region "pass": (result, counter)."""
    from attattr_cli.ops.graphs import OpCounter

    loaded = prepare(model, tokenizer, "tiny", lm=lm)
    scorer = Scorer(loaded, ScoreOptions(dtype="float64", lm=lm, group=1, **options))
    scorer.sweep = swept
    scorer.score(Example(0, TEXT))  # lazy set-up outside the count
    counter = OpCounter(where=True)
    original, step = sweep._pass, Scorer._step_chunk

    def counted(*a, **k):
        with counter.region("pass"):
            return original(*a, **k)

    def counted_step(self, *a, **k):
        with counter.region("pass"):
            return step(self, *a, **k)

    sweep._pass, Scorer._step_chunk = counted, counted_step
    try:
        with counter:
            result = scorer.score(Example(0, TEXT))
    finally:
        sweep._pass, Scorer._step_chunk = original, step
    return result, counter


@pytest.mark.parametrize("model_type", ["bert", "llama", "gpt2", "deberta-v2"])
@pytest.mark.parametrize("options", [dict(steps=6, rule="right"), dict(steps=5, rule="gauss"), dict(tol=0.05)],
                         ids=["right", "gauss", "tol"])
def test_passes_hold_no_host_synchronisation(model_type, options, tokenizer):
    """Inside an integration pass (a sweep or one layer's pass, forward and backward) no op
    waits for the device: no item(), nonzero, boolean-mask indexing or host copy (OpCounter on
    the CPU counts every such op, on host tensors too); the numbers are those of a plain run."""
    model, lm = build(model_type, torch.float64)
    for swept in (True, False):
        result, counter = _counted_score(model, tokenizer, lm, swept, **options)
        plain, _ = _score(model, tokenizer, lm, swept, **options)
        assert counter.entries["pass"] > 0 and counter.regions["pass"].launching > 0
        assert counter.regions["pass"].syncs == 0, dict(counter.regions["pass"].sync_sites)
        assert counter.all.syncs > 0  # (between the passes they still happen, and are counted)
        for fam in result.families:
            for x, y in zip(result.families[fam].attribution, plain.families[fam].attribution):
                assert np.array_equal(x, y)


@pytest.mark.parametrize("row_layer", [[0, 0, 1, 1, 1, 2], [1, 1, 1], [0, 2, 2, 3], [2, 0, 1, 2]])
def test_sweep_indices_made_on_the_host_are_the_device_ones(row_layer):
    """The index tensors a Sweep makes before its pass are those the pass used to ask the device
    for (nonzero of the rows at or below a layer, of the rows targeting it and of the others)."""
    from attattr_cli.ops import select_backend

    rl = torch.tensor(row_layer)
    alphas = torch.rand(len(row_layer), dtype=torch.float64)
    plan = attention.Sweep("self", rl, alphas, select_backend("torch", "cpu"))
    assert plan.host_layers == tuple(row_layer)
    for j in range(min(row_layer), max(row_layer) + 2):
        idx, on_device = plan.rows_at(j)
        want = torch.nonzero(rl <= j).flatten()
        assert torch.equal(idx, want)
        assert on_device is None if len(want) == len(rl) else torch.equal(on_device, want)
        if j in plan.split:
            t, o, alpha_rows = plan.split[j]
            is_target = rl.index_select(0, want) == j
            assert torch.equal(t, torch.nonzero(is_target).flatten())
            assert torch.equal(o, torch.nonzero(~is_target).flatten())
            assert torch.equal(alphas.index_select(0, alpha_rows), alphas.index_select(0, want)[is_target])
        else:
            assert j not in row_layer


@pytest.mark.parametrize("with_mask", [False, True])
def test_swept_layer_from_host_indices_equals_the_device_path(with_mask):
    """_swept_layer with the sweep's host-made indices (the layer known) gives bit for bit what
    the path that asks the device (nonzero, boolean masks) gives: output, leaf and saved q/k/v."""
    from attattr_cli.ops import select_backend

    rl = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    gen = torch.Generator().manual_seed(3)
    alphas = torch.rand(len(rl), generator=gen, dtype=torch.float64)
    for layer in (0, 1, 2):
        rows = torch.nonzero(rl <= layer).flatten()
        b = len(rows)
        q, k, v = (torch.randn(b, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
        mask = torch.zeros(b, 1, 5, 5, dtype=torch.float64)
        if with_mask:
            mask[:, :, :, -1] = torch.finfo(torch.float64).min
        mask = mask if with_mask else None
        got = []
        for known in (True, False):
            plan = attention.Sweep("self", rl, alphas, select_backend("torch", "cpu"))
            plan.rows_now, plan.layer_now = rows, (layer if known else None)
            out = attention._swept_layer(plan, layer, q, k, v, mask, mask, None, None, None, False)
            got.append((out, plan.leaves[layer], plan.saved[layer]))
        (a, leaf_a, saved_a), (b_, leaf_b, saved_b) = got
        assert torch.equal(a, b_) and torch.equal(leaf_a, leaf_b)
        for key in ("q", "k", "v"):
            assert torch.equal(saved_a[key], saved_b[key])
    plan = attention.Sweep("self", rl, alphas, select_backend("torch", "cpu"))
    plan.rows_now, plan.layer_now = torch.arange(len(rl)), 3
    q = torch.randn(len(rl), 2, 5, 4, dtype=torch.float64)
    assert attention._swept_layer(plan, 3, q, q, q, None, None, None, None, None, False) is None  # no row targets 3


@pytest.mark.parametrize("model_type", ["bert", "llama"])
@pytest.mark.parametrize("swept", [False, True], ids=["per-layer", "sweeps"])
def test_emulated_graphs_serve_every_example_of_a_shape_with_the_same_numbers(model_type, swept, tokenizer,
                                                                              monkeypatch):
    """ATTATTR_CUDA_GRAPHS=emulate (ops/graphs.py: a CUDA graph's capture and replay on the
    CPU): the passes of the first example of a length are captured, those of every later one
    of that length replay them, reading its ids and clean forward through the static slots;
    every stored number equals the eager scoring's bit for bit (a graph that read the first
    example's tensors, or a layer's attention cached from it, would not)."""
    from attattr_cli.ops import graphs

    model, lm = build(model_type, torch.float64)
    texts = ["w1 w2 w3 w4 w5", "w7 w9 w11 w2 w13", "w3 w3 w3", "w5 w6 w7", "w8 w1 w4 w4 w2"]
    for options in (dict(steps=4, rule="gauss"), dict(tol=0.05)):
        results = {}
        for mode in ("", "emulate"):
            monkeypatch.setenv(graphs.ENV_VAR, mode)
            scorer = Scorer(prepare(model, tokenizer, "tiny", lm=lm),
                            ScoreOptions(dtype="float64", lm=lm, group=1, **options))
            scorer.sweep = swept
            results[mode] = [scorer.score(Example(i, t)) for i, t in enumerate(texts)]
        shared = scorer.__dict__["_graphs"]
        assert shared.eager_calls == 0 and not shared.fallback_reasons, shared.stats()
        assert shared.replays > shared.captures > 0, shared.stats()  # later examples replay the first's graphs
        for eager, replayed in zip(results[""], results["emulate"]):
            for fam in eager.families:
                a, b = eager.families[fam], replayed.families[fam]
                for name in ("attribution", "head_sum", "head_max", "residual", "f_baseline", "error", "nodes",
                             "status"):
                    x, y = getattr(a, name), getattr(b, name)
                    assert (x is None) == (y is None) and (x is None or np.array_equal(x, y, equal_nan=True)), name
            assert eager.f_full == replayed.f_full


def test_a_run_with_graphs_says_what_they_did(tmp_path, monkeypatch):
    """score with ATTATTR_CUDA_GRAPHS on notes how many passes were captured, replayed for a
    later example and run eagerly; off, it notes nothing of graphs."""
    import attattr_cli as aa
    from attattr_cli.ops import graphs

    notes = {}
    for mode in ("emulate", ""):
        monkeypatch.setenv(graphs.ENV_VAR, mode)
        report = aa.score(out=str(tmp_path / f"s{mode}.h5"), examples="0:12", compute=aa.Compute(group=1))
        notes[mode] = [n for n in report.notes if "graphs" in n]
    (line,) = notes["emulate"]
    captured, replayed = (int(x) for x in re.findall(r"(\d+) passes captured, (\d+) replayed", line)[0])
    assert line.startswith("emulated graphs:") and captured > 0 and replayed > 0 and "0 run eagerly" in line
    assert notes[""] == []


def _unbound(self, enc, clean):
    """bind_static without the static slots: the passes read a copy of this example's clean forward."""
    clean.outputs = {path: {i: o.clone() for i, o in per.items()} for path, per in clean.outputs.items()}
    clean.static = True  # keyed by shape all the same
    return clean


def _unbound_inputs(self, enc):
    """bind_inputs without the static slots: the clean forward reads this example's own ids."""
    self.__dict__["_bound"] = (enc, {"input_ids": torch.tensor([enc.input_ids])})


@pytest.mark.parametrize("broken", ["bind_static", "bind_inputs"])
def test_emulated_graphs_catch_a_pass_that_reads_the_first_example(broken, tokenizer, monkeypatch):
    """The check above has teeth: graphs keyed by shape over tensors that are not the static
    slots (the clean forward's layer outputs that the passes read, or the token ids that the
    captured clean forward reads) replay the first example's numbers for the second."""
    from attattr_cli.engine.layer_integral import Integration
    from attattr_cli.ops import graphs

    model, lm = build("bert", torch.float64)
    texts = ["w1 w2 w3 w4 w5", "w7 w9 w11 w2 w13"]
    results = {}
    for mode in ("", "emulate"):
        monkeypatch.setenv(graphs.ENV_VAR, mode)
        monkeypatch.setattr(Integration, broken, _unbound if broken == "bind_static" else _unbound_inputs)
        scorer = Scorer(prepare(model, tokenizer, "tiny", lm=lm), ScoreOptions(dtype="float64", steps=4))
        results[mode] = [scorer.score(Example(i, t)) for i, t in enumerate(texts)]
    assert np.array_equal(results[""][0].attribution, results["emulate"][0].attribution)
    assert not np.array_equal(results[""][1].attribution, results["emulate"][1].attribution)
    if broken == "bind_inputs":  # the clean forward itself replayed the first example's
        np.testing.assert_array_equal(results["emulate"][1].logits, results["emulate"][0].logits)


@pytest.mark.parametrize("model_type", ["bert", "llama"])
@pytest.mark.parametrize("swept", [False, True], ids=["per-layer", "sweeps"])
def test_cuda_graphs_switch_on_the_cpu_falls_back_with_the_same_numbers(model_type, swept, tokenizer, monkeypatch):
    """ATTATTR_CUDA_GRAPHS=1 routes each pass (one layer's, or a sweep's) through CapturedPass:
    on the CPU it runs eagerly (the reason recorded, nothing captured) and every number is the
    same bit for bit; off (the default) no CapturedPass is made."""
    from attattr_cli.ops import graphs

    model, lm = build(model_type, torch.float64)
    for options in (dict(steps=4, rule="gauss"), dict(tol=0.05)):
        monkeypatch.delenv(graphs.ENV_VAR, raising=False)
        off, _ = _score(model, tokenizer, lm, swept, **options)
        monkeypatch.setenv(graphs.ENV_VAR, "1")
        loaded = prepare(model, tokenizer, "tiny", lm=lm)
        scorer = Scorer(loaded, ScoreOptions(dtype="float64", lm=lm, group=1, **options))
        scorer.sweep = swept
        on = scorer.score(Example(0, TEXT))
        captured = scorer.__dict__["_graphs"]
        assert captured.eager_calls > 0 and captured.captures == captured.replays == 0
        assert captured.stats()["fallbacks"] == ["inputs not on a CUDA device"]
        # a sweep's plan is made once per key, outside the pass, and kept with it
        assert bool(captured.held) == swept
        for fam in on.families:
            a, b = on.families[fam], off.families[fam]
            for x, y in zip(a.attribution, b.attribution):
                assert np.array_equal(x, y)
            assert np.array_equal(a.nodes, b.nodes)
            assert np.array_equal(a.error, b.error, equal_nan=True)
            assert np.array_equal(a.status, b.status)
        np.testing.assert_array_equal(on.residual, off.residual)
    monkeypatch.delenv(graphs.ENV_VAR)
    loaded = prepare(model, tokenizer, "tiny", lm=lm)
    scorer = Scorer(loaded, ScoreOptions(dtype="float64", lm=lm, group=1, steps=2))
    scorer.sweep = False
    scorer.score(Example(0, TEXT))
    assert "_graphs" not in scorer.__dict__ and "_slots" not in scorer.__dict__


@pytest.mark.parametrize("case", ["gold", "predicted", "continuation"])
def test_a_replayed_clean_forward_takes_each_examples_target(case, tokenizer, monkeypatch):
    """The captured clean forward computes its target on the device (the prediction's argmax, or
    the ids given before the forward: a gold label, a continuation), so examples of one length
    with different targets share its graph and each gets its own alpha = 1 gradient: every
    stored number equals the eager scoring's."""
    from attattr_cli.ops import graphs

    texts = ["w1 w2 w3 w4 w5", "w7 w9 w11 w2 w13", "w5 w5 w8 w1 w3", "w2 w4 w6 w8 w10", "w9 w3 w1 w7 w7"]
    if case == "continuation":
        model, lm = build_model("llama", torch.float64, lm=True), True
    else:
        model, lm = build("bert", torch.float64)
        with torch.no_grad():  # the class bias moved to the middle of these examples' margins: both classes predicted
            logits = torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in texts])
            model.classifier.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    options = dict(steps=3, rule="right")  # alpha = 1 a node: the clean backward gives it
    if case == "gold":
        options["target"] = "gold"
    if case == "continuation":
        options["continuation"] = "w4 w6"
    results = {}
    for mode in ("", "emulate"):
        monkeypatch.setenv(graphs.ENV_VAR, mode)
        scorer = Scorer(prepare(model, tokenizer, "tiny", lm=lm), ScoreOptions(dtype="float64", lm=lm, group=1, **options))
        results[mode] = [scorer.score(Example(i, t, label=i % 2 if case == "gold" else None))
                         for i, t in enumerate(texts)]
    shared = scorer.__dict__["_graphs"]
    clean = [key for key in shared.graphs if key[0][0] == "clean"]
    assert len(clean) == 1 and shared.eager_calls == 0, shared.stats()  # one graph for the five examples
    if case != "continuation":  # the examples' targets differ: the one graph took each one's
        assert len({r.target for r in results["emulate"]}) > 1
    for eager, replayed in zip(results[""], results["emulate"]):
        assert eager.target == replayed.target and eager.f_full == replayed.f_full
        a, b = eager.families["self"], replayed.families["self"]
        for name in ("attribution", "residual", "error", "nodes"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_a_captured_clean_forward_checks_the_ids_for_padding_on_the_host(monkeypatch):
    """transformers' padding check (a read of the ids on the device in every GPT-2 forward) runs
    once on the host's copy of the ids around a captured clean forward, and not in the forwards
    inside it; outside, a clean forward runs it as transformers does."""
    import transformers

    model, _ = build("gpt2", torch.float64)
    calls = []

    def check(self, input_ids, attention_mask=None):
        calls.append(input_ids.tolist())

    monkeypatch.setattr(transformers.PreTrainedModel, "warn_if_padding_and_no_attention_mask", check)
    ids = [5, 6, 7, 8]
    with attention.taken_over(model), torch.no_grad():
        with attention.active(attention.Record()):
            model(input_ids=torch.tensor([ids]))
        assert calls == [[ids]]  # the forward's own check
        with attention.checked_on_host(model, ids):
            for _ in range(2):
                with attention.active(attention.Record()):
                    model(input_ids=torch.tensor([ids]))
        assert calls == [[ids], [ids]]  # once, before the two forwards


@pytest.mark.parametrize("swept", [False, True], ids=["per-layer", "sweeps"])
def test_max_attribution_is_measured_once_for_the_estimate_and_the_residual(swept, tokenizer, monkeypatch):
    """A fixed rule's embedded estimate measures max |Attr(G)|, which is also the residual's scale:
    the assembly takes it from there (one map measure per layer less), unless G changed since."""
    from attattr_cli.engine import layer_integral

    model, lm = build("bert", torch.float64)
    calls = []
    real = layer_integral.map_measures

    def counted(a, v, g, dims=()):
        calls.append(len(g))
        return real(a, v, g, dims)

    monkeypatch.setattr(layer_integral, "map_measures", counted)
    scorer = Scorer(prepare(model, tokenizer, "tiny", lm=lm), ScoreOptions(dtype="float64", steps=4, rule="gauss", group=1))
    scorer.sweep = swept
    result = scorer.score(Example(0, TEXT))
    layers = len(result.layers)
    assert sum(calls) == 2 * layers  # G - G_low and G of each layer, for the estimate; none for the residual
    # the same pairs again: taken from what was measured; G changed in place: measured anew
    g = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    saved = {"q": torch.randn(1, 2, 8, 4, dtype=torch.float64), "k": torch.randn(1, 2, 8, 4, dtype=torch.float64),
             "v": torch.randn(1, 2, 8, 4, dtype=torch.float64), "mask": None, "scale": 0.5, "softcap": None,
             "causal": False}
    first = scorer.embedded_measures([(g, g * 0.5, saved)])
    calls.clear()
    assert torch.equal(scorer.measures([(g, saved)])[0, 0], first[0][1]) and calls == []
    g.mul_(2)
    assert torch.equal(scorer.measures([(g, saved)])[0, 0], 2 * first[0][1]) and sum(calls) == 1
