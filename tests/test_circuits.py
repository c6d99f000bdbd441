"""Circuits: head methods against independent references, MIB's curve, the command and the API.

The references here do not use attattr's HeadPatch plan: they patch a head's output by a
forward pre-hook on the layer's output projection (``o_proj``), whose input is the heads'
outputs side by side ([batch, query, head * d]).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import build_model, one_error_line, run_cli


def _pairs():
    from attattr_cli.data.pairs import Pair

    rows = [("w1 w2 w3 w4 w1", "w5 w6 w7 w8 w9", "w2", "w1"),
            ("w3 w1 w2 w5 w3", "w9 w8 w7 w6 w5", "w1", "w3"),
            ("w4 w6 w2 w4", "w1 w3 w5 w7", "w6", "w4"),
            ("w7 w8 w9 w10 w7", "w11 w12 w13 w14 w15", "w8", "w7")]
    return [Pair(i, p, c, (a,), (f,)) for i, (p, c, a, f) in enumerate(rows)]


@pytest.fixture
def loaded(tokenizer):
    from attattr_cli.models.loading import prepare

    model = build_model("llama", torch.float64, num_labels=2, layers=2, lm=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return prepare(model, tokenizer, "tiny-llama", lm=True)


def _ctx(loaded, **kw):
    from attattr_cli.analysis.circuits.task import CircuitTask, Context

    return Context(CircuitTask(loaded, _pairs()), **kw)


def _hooked_metric(loaded, task, ids, answer, foil, patch=None, leaf=False):
    """The metric with heads replaced through o_proj pre-hooks: ``patch`` {(layer, head): z'}."""
    model = loaded.model
    layers = model.model.layers
    d = model.config.head_dim if getattr(model.config, "head_dim", None) else model.config.hidden_size // model.config.num_attention_heads
    handles, grabbed = [], {}

    def hook_for(l):
        def hook(module, args):
            x = args[0]
            if leaf:
                x = x + torch.zeros_like(x, requires_grad=True)
                grabbed[l] = x
            if patch:
                x = x.clone()
                for (pl, h), z in patch.items():
                    if pl == l:
                        x[..., h * d:(h + 1) * d] = z
            return (x,) + args[1:]
        return hook

    for l, layer in enumerate(layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(hook_for(l)))
    try:
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]
    finally:
        for h in handles:
            h.remove()
    return logits[:, answer].mean(-1) - logits[:, foil].mean(-1), grabbed, d


def _grab(loaded, ids, mlp: bool = False):
    """Each layer's heads' outputs [batch, query, head * d] (the o_proj input) of a plain run;
    with ``mlp`` each layer's MLP output instead."""
    seen = {}
    layers = loaded.model.model.layers
    keep = lambda l: (lambda m, a, *o: seen.__setitem__(l, (o[0] if mlp else a[0]).detach()))  # noqa: E731
    hs = [layer.mlp.register_forward_hook(keep(l)) if mlp else layer.self_attn.o_proj.register_forward_pre_hook(keep(l))
          for l, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            loaded.model(input_ids=ids, use_cache=False)
    finally:
        for h in hs:
            h.remove()
    return seen


def test_exact_patching_equals_patching_one_head_by_hand(loaded):
    from attattr_cli.analysis.circuits import REGISTRY

    ctx = _ctx(loaded)
    scores = REGISTRY["patching"].compute(ctx)
    task = ctx.task
    for b in task.batches:
        for p in range(b.size):
            ids, cf = b.clean[p:p + 1], b.counterfactual[p:p + 1]
            a, f = b.answer[p].unique(), b.foil[p].unique()
            cf_z = _grab(loaded, cf)
            with torch.no_grad():
                clean_m, _, d = _hooked_metric(loaded, task, ids, a, f)
                for l, h in ((0, 0), (1, 3), (1, 1)):
                    m, _, _ = _hooked_metric(loaded, task, ids, a, f, {(l, h): cf_z[l][..., h * d:(h + 1) * d]})
                    assert scores[b.positions[p], l, h] == pytest.approx(float(clean_m - m), abs=1e-9)


def test_atp_is_the_gradient_times_the_output_change(loaded):
    from attattr_cli.analysis.circuits import REGISTRY

    ctx = _ctx(loaded)
    scores = REGISTRY["atp"].compute(ctx)
    task = ctx.task
    b = task.batches[0]
    ids, cf = b.clean[:1], b.counterfactual[:1]
    cf_z, clean_z = _grab(loaded, cf), _grab(loaded, ids)
    with torch.enable_grad():
        m, grabbed, d = _hooked_metric(loaded, task, ids, b.answer[0].unique(), b.foil[0].unique(), leaf=True)
        grads = torch.autograd.grad(m.sum(), [grabbed[l] for l in sorted(grabbed)])
    for l, g in enumerate(grads):
        for h in range(loaded.model.config.num_attention_heads):
            s = slice(h * d, (h + 1) * d)
            want = float((g[..., s] * (clean_z[l][..., s] - cf_z[l][..., s])).sum())
            assert scores[b.positions[0], l, h] == pytest.approx(want, rel=1e-8, abs=1e-10)


def test_gate_integrals_add_up_to_the_clean_minus_ablated_metric(loaded):
    """Completeness: the scores of attr-gates add up to m(N) - m(empty); more nodes, smaller residual."""
    from attattr_cli.analysis.circuits import REGISTRY
    from attattr_cli.analysis.ablation import ends

    residual = []
    for steps in (2, 8):
        ctx = _ctx(loaded, steps=steps)
        clean, empty = ends(ctx)
        scores = REGISTRY["attr-gates"].compute(ctx)
        residual.append(np.abs(scores.sum((1, 2)) - (clean - empty)).max())
    assert residual[1] < 1e-6 * max(1.0, np.abs(clean - empty).max())
    assert residual[1] <= residual[0]


def test_counterfactual_pattern_attribution_is_complete_per_layer(loaded):
    """attr-cf: a layer's head scores add up to F(clean) - F(that layer's pattern from the counterfactual)."""
    from attattr_cli.analysis.circuits.pattern import pattern_attribution
    from attattr_cli.engine import attention

    ctx = _ctx(loaded, steps=12)
    per = pattern_attribution(ctx, counterfactual=True, reduce="sum")
    task = ctx.task
    b = task.batches[0]
    with task.over(), torch.no_grad():
        _, _, cf_probs = task.record(b.counterfactual[:1], want_probs=True)
        clean = task.metric(task.logits(b.clean[:1]), b)[0]
        for l in range(task.layers):
            plan = attention.PatternPath(target=torch.tensor([l]), alpha=torch.zeros(1), source={l: cf_probs[l]})
            swapped = task.metric(task.logits(b.clean[:1], plan), b)[0]
            assert per[b.positions[0], l].sum() == pytest.approx(float(clean - swapped), abs=1e-7)


def test_area_is_trapezoids_over_k_and_masks_keep_int_k_n():
    from attattr_cli.analysis.ablation import keep_masks
    from attattr_cli.analysis.circuits.evaluate import area

    cpr, cmd = area([0, 0.5, 1], [0, 1, 1])
    assert cpr == pytest.approx(0.75) and cmd == pytest.approx(0.25)
    scores = np.arange(20, dtype=float).reshape(4, 5) - 10
    m = keep_masks(scores, absolute=False, ks=(0.1, 0.5, 1.0))
    assert m.sum((1, 2)).tolist() == [2, 10, 20]
    assert m[0, 3, 4] == 1 and m[0, 3, 3] == 1  # the two largest signed scores
    a = keep_masks(scores, absolute=True, ks=(0.05,))
    assert a[0, 0, 0] == 1  # |-10| is the largest absolute score


def test_curve_ends_at_one_and_the_recommended_method_is_always_run(loaded):
    import attattr_cli as aa

    res = aa.circuit(loaded, _pairs(), methods="random,attention", bootstrap=20)
    assert list(res.methods)[0] == res.recommended
    for r in res.methods.values():
        assert r.curve[-1] == pytest.approx(1.0) and r.curve_abs[-1] == pytest.approx(1.0)
        assert r.cpr_interval[0] <= r.cpr <= r.cpr_interval[1] + 1e-12
    df = res.to_pandas()
    assert set(df["method"]) == {res.recommended, "random", "attention"}
    assert len(res.to_pandas("curves")) == 3 * 2 * 10
    assert "CPR" in res._repr_html_() and "Circuit(" in repr(res)
    fig = res.plot()
    assert fig.axes and len(fig.axes[0].lines) >= 3
    assert res.heatmap("random").axes


def test_ablations_mean_and_zero_run_and_differ(loaded):
    import attattr_cli as aa

    zero = aa.circuit(loaded, _pairs(), methods="atp", ablation="zero", bootstrap=10)
    mean = aa.circuit(loaded, _pairs(), methods="atp", ablation="mean", bootstrap=10)
    assert zero.empty != pytest.approx(mean.empty)
    assert zero.clean == pytest.approx(mean.clean)


def test_docs_table_is_the_registry():
    from pathlib import Path

    from attattr_cli.analysis.circuits import markdown_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "circuits.md").read_text()
    assert markdown_table() in doc




def test_cli_circuit_json_and_hdf5(llama_dir, tmp_path):
    import h5py

    from attattr_cli.data.pairs import write_pairs

    data = tmp_path / "pairs.jsonl"
    write_pairs(data, _pairs())
    js, h5 = tmp_path / "c.json", tmp_path / "c.h5"
    r = run_cli("circuit", "--model", str(llama_dir), "--data", str(data), "--methods", "patching,atp",
                "--json", str(js), "--out", str(h5), "--bootstrap", "20", "-q")
    assert r.exit_code == 0, r.stderr
    assert "CPR" in r.stdout and "patching" in r.stdout
    doc = json.loads(js.read_text())
    assert set(doc["methods"]) >= {"patching", "atp", doc["recommended"]}
    m = doc["methods"]["atp"]
    assert len(m["curve"]) == 10 and len(m["scores"]) == 2 * 4 and m["spearman_patching"] is not None
    assert doc["methods"]["patching"]["spearman_patching"] == pytest.approx(1.0)
    split = doc["split"]  # MIB's protocol by default: a seeded half for the methods, the rest for the curve
    assert split["kind"] == "half" and not split["same_pairs"]
    assert sorted(split["fit"] + split["eval"]) == [0, 1, 2, 3] and not set(split["fit"]) & set(split["eval"])
    assert doc["pairs"] == len(split["eval"])
    with h5py.File(h5) as f:
        assert f.attrs["schema"] == "attattr.circuit"
        assert f["methods/atp/per_pair"].shape == (len(split["fit"]), 2, 4)
        assert f["split/fit"][()].tolist() == split["fit"] and f["split/eval"][()].tolist() == split["eval"]


def test_cli_circuit_refuses_pairs_of_unequal_length(llama_dir, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "w1 w2 w3", "counterfactual": "w1 w2", "answer": "w4", "foil": "w5"}) + "\n")
    r = run_cli("circuit", "--model", str(llama_dir), "--data", str(data), "--split", "none", "-q")
    assert r.exit_code == 2
    line = one_error_line(r, "pair 0", "equal token lengths")
    assert line.startswith("Error:")


def test_cli_circuit_refuses_unknown_method_before_loading(llama_dir, tmp_path):
    from attattr_cli.data.pairs import write_pairs

    data = tmp_path / "pairs.jsonl"
    write_pairs(data, _pairs())
    r = run_cli("circuit", "--model", str(llama_dir), "--data", str(data), "--methods", "nope", "-q")
    assert r.exit_code == 2
    one_error_line(r, "unknown head method 'nope'")


def test_patching_only_the_pattern_or_only_the_values_equals_doing_it_by_hand(loaded):
    """patching-pattern puts A' V in the head's place, patching-values A V' (A, V clean; primes
    counterfactual): checked with eager attention weights and v_proj outputs read by hooks."""
    from attattr_cli.analysis.circuits import REGISTRY

    ctx = _ctx(loaded)
    pattern = REGISTRY["patching-pattern"].compute(ctx)
    values = REGISTRY["patching-values"].compute(ctx)
    task = ctx.task
    model = loaded.model
    cfg = model.config
    H, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    b = task.batches[0]
    ids, cf = b.clean[:1], b.counterfactual[:1]

    def probs_and_values(x):
        vs = {}
        hs = [layer.self_attn.v_proj.register_forward_hook(lambda m, a, o, l=l: vs.__setitem__(l, o.detach()))
              for l, layer in enumerate(model.model.layers)]
        old = cfg._attn_implementation
        cfg._attn_implementation = "eager"
        try:
            with torch.no_grad():
                out = model(input_ids=x, use_cache=False, output_attentions=True)
        finally:
            cfg._attn_implementation = old
            for h in hs:
                h.remove()
        n = x.shape[1]
        vals = {l: v.view(1, n, kv, -1).transpose(1, 2).repeat_interleave(H // kv, 1) for l, v in vs.items()}
        return out.attentions, vals

    a, v = probs_and_values(ids)
    a2, v2 = probs_and_values(cf)
    with torch.no_grad():
        clean_m, _, d = _hooked_metric(loaded, task, ids, b.answer[0].unique(), b.foil[0].unique())
        for l, h in ((0, 1), (1, 2)):
            for table, z in ((pattern, a2[l][0, h] @ v[l][0, h]), (values, a[l][0, h] @ v2[l][0, h])):
                m, _, _ = _hooked_metric(loaded, task, ids, b.answer[0].unique(), b.foil[0].unique(), {(l, h): z})
                # (eager attention takes its softmax in float32: agreement to float32 rounding)
                assert table[b.positions[0], l, h] == pytest.approx(float(clean_m - m), rel=1e-5, abs=1e-8)



def test_tiers_take_membership_from_the_gates_and_order_from_verified_atp(loaded, monkeypatch):
    """attr-tiers: heads fall in the curve's tiers (10, 20, 50 %) by |attr-gates| and are ordered
    inside a tier by |AtP|, the heads of largest |AtP| and every head of the first layer by their
    exact patching effect instead."""
    from attattr_cli.analysis.circuits import REGISTRY, tiers

    member = np.array([[5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.4, 0.3, 0.2, 0.1]])
    inner = np.array([[-0.1, 0.2, 9.0, -3.0, 0.0, 7.0, 1.0, 2.0, 8.0, 0.3]])
    r = tiers.tiered(member, inner)  # 10 heads: tiers [0, 1), [1, 2), [2, 5), [5, 10)
    order = np.argsort(-np.abs(r.ravel())).tolist()
    assert order == [0, 1, 2, 3, 4, 8, 5, 7, 6, 9]
    assert r[0, 3] < 0 and r[0, 0] < 0 and r[0, 4] > 0  # signed by the inner value (0 counts as +)
    assert sorted(np.abs(r.ravel()).tolist()) == list(range(1, 11))

    monkeypatch.setattr(tiers, "VERIFIED", 3)
    ctx = _ctx(loaded)
    got = REGISTRY["attr-tiers"].compute(ctx)
    assert np.allclose(got, got[0])  # a ranking of the means: the same for every pair
    gates = REGISTRY["attr-gates"].compute(ctx).mean(0)
    atp = REGISTRY["atp"].compute(ctx).mean(0)
    exact = REGISTRY["patching"].compute(ctx).mean(0)
    inner = atp.copy()
    for i in np.argsort(-np.abs(atp.ravel()), kind="stable")[:3]:
        inner.flat[i] = exact.flat[i]
    inner[:tiers.EXACT_LAYERS] = exact[:tiers.EXACT_LAYERS]  # the first layer's heads: exact, all of them
    assert tiers.EXACT_LAYERS >= 1 and not np.allclose(atp[0], exact[0])  # so the step is seen here
    for i in tiers.disagreeing(gates, atp, tiers.DISAGREE):  # gate integral and AtP of opposite signs: exact
        inner.flat[i] = exact.flat[i]
    candidates = [tiers.tiered(gates, inner, first=first, signed_first=signed) for first, signed in tiers.FIRST]
    np.testing.assert_array_equal(got[0], candidates[ctx.choose(candidates, tiers.CHECKED)])


def test_tiers_verify_the_heads_whose_two_estimates_disagree_in_sign():
    from attattr_cli.analysis.circuits import tiers

    ig = np.array([[0.9, -0.5, 0.3, -2.0, 0.1, 0.0]])
    atp = np.array([[-0.1, -0.4, -0.2, 1.0, -0.3, 0.5]])
    assert tiers.disagreeing(ig, atp, 10).tolist() == [3, 0, 2, 4]  # by |ig|; same signs and zeros left out
    assert tiers.disagreeing(ig, atp, 2).tolist() == [3, 0]


def test_tiers_first_tier_orders():
    """The first tier's candidate orders: by |inner|, by inner's sign (largest first), and
    greedy on additive shares (the running sum nearest the total)."""
    from attattr_cli.analysis.circuits import tiers

    member = np.linspace(40, 1, 40)[None, :]  # 40 heads: the first tier is heads 0-3
    inner = np.zeros((1, 40))
    inner[0, :4] = [-3.0, 1.0, 5.0, -0.5]
    share = np.zeros((1, 40))
    share[0, :4] = [2.0, 3.0, -1.0, 0.5]  # total 4.5
    first_four = lambda r: np.argsort(-np.abs(r.ravel()), kind="stable")[:4].tolist()  # noqa: E731
    assert first_four(tiers.tiered(member, inner)) == [2, 0, 1, 3]
    assert first_four(tiers.tiered(member, inner, first="sign")) == [2, 1, 3, 0]
    # running sums 3, 5, 4, 4.5: each step the head that lands nearest 4.5
    assert first_four(tiers.tiered(member, inner, first="greedy", additive=share)) == [1, 0, 2, 3]
    for first in ("magnitude", "sign", "greedy"):  # the other tiers and the signs do not change
        r = tiers.tiered(member, inner, first=first, additive=share)
        np.testing.assert_array_equal(np.sort(np.abs(r.ravel()))[::-1][4:], np.arange(36, 0, -1))
        assert (np.sign(r.ravel()[:4]) == [-1, 1, 1, -1]).all()
    # the first tier by the signed member: the four largest member values, not |member|
    member = member.copy()
    member[0, 1] = -45.0
    r = tiers.tiered(member, inner, signed_first=True)
    assert sorted(np.argsort(-np.abs(r.ravel()), kind="stable")[:4].tolist()) == [0, 2, 3, 4]
    assert np.argsort(-np.abs(r.ravel()), kind="stable")[4] == 1  # |member| leads the second tier


def test_choose_picks_the_ranking_nearest_one_where_measured(loaded):
    """Context.choose: the ranking whose curve is nearest 1 at the given k, each point weighted
    by its trapezoids' width; the same sets as the evaluation's curve."""
    from attattr_cli.analysis.ablation import PERCENTAGES, curve_from, ends, keep_masks, per_pair_metrics

    ctx = _ctx(loaded)
    rng = np.random.default_rng(0)
    shape = (ctx.task.layers, ctx.task.width)
    rankings = [rng.standard_normal(shape) for _ in range(4)]
    rankings.append(rankings[1].copy())  # a duplicate: its sets are run once
    ks = (0.2, 0.5)
    clean, empty = ends(ctx)
    costs = []
    for r in rankings:  # the whole curve, read at 20 % (width (0.5 - 0.1) / 2) and 50 % (width (1 - 0.2) / 2)
        f = curve_from(per_pair_metrics(ctx, keep_masks(r, True)), clean, empty)
        costs.append(0.2 * abs(1 - f[PERCENTAGES.index(0.2)]) + 0.4 * abs(1 - f[PERCENTAGES.index(0.5)]))
    assert len(set(np.round(costs, 12))) > 1  # the rankings differ where measured
    assert ctx.choose(rankings, ks) == int(np.argmin(costs))
    with pytest.raises(ValueError):
        ctx.choose(rankings, (0.3,))  # not a point of the curve


# -- MLP nodes (--nodes heads+mlp) -----------------------------------------------------------
def _mlp_metric(loaded, ids, answer, foil, replace=None):
    """The metric with layer ``l``'s MLP output replaced by ``replace[l]`` (a forward hook on
    layer.mlp: no attattr plan)."""
    model = loaded.model
    hs = [layer.mlp.register_forward_hook(lambda m, a, o, l=l: replace[l] if l in (replace or {}) else o)
          for l, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[:, -1].double()
    finally:
        for h in hs:
            h.remove()
    return logits[:, answer].mean(-1) - logits[:, foil].mean(-1)


def test_mlp_nodes_patching_and_gate_completeness(loaded):
    """Each layer's MLP is one more node (the last column): its exact patching effect equals
    replacing the MLP's output by hand, heads' effects are unchanged, and the gate integral
    over heads and MLPs adds up to m(N) - m(every head and MLP ablated)."""
    from attattr_cli.analysis.circuits import REGISTRY
    from attattr_cli.analysis.ablation import ends
    from attattr_cli.analysis.circuits.task import CircuitTask, Context

    ctx = Context(CircuitTask(loaded, _pairs(), mlp=True), steps=8)
    heads_ctx = _ctx(loaded)
    H = ctx.task.heads
    assert ctx.task.width == H + 1
    exact = REGISTRY["patching"].compute(ctx)
    assert exact.shape == (4, 2, H + 1)
    np.testing.assert_allclose(exact[..., :H], REGISTRY["patching"].compute(heads_ctx), atol=1e-10)
    b = ctx.task.batches[0]
    for p in range(b.size):
        ids, cf = b.clean[p:p + 1], b.counterfactual[p:p + 1]
        a, f = b.answer[p].unique(), b.foil[p].unique()
        cf_mlp = _grab(loaded, cf, mlp=True)
        clean_m = _mlp_metric(loaded, ids, a, f)
        for l in range(2):
            m = _mlp_metric(loaded, ids, a, f, {l: cf_mlp[l]})
            assert exact[b.positions[p], l, H] == pytest.approx(float(clean_m - m), abs=1e-9)
    # (with every head patched the last position reads only the counterfactual's: its MLPs too,
    # so m(empty) is the same with or without MLP nodes; the gate path in between differs)
    clean, empty = ends(ctx)
    gates = REGISTRY["attr-gates"].compute(ctx)
    np.testing.assert_allclose(gates.sum((1, 2)), clean - empty, atol=1e-6 * max(1.0, np.abs(clean - empty).max()))
    assert np.abs(gates[..., H]).max() > 0
    nap = REGISTRY["nap-ig"].compute(ctx)
    assert nap.shape == (4, 2, H + 1) and np.abs(nap[..., H]).max() > 0


def test_cli_circuit_mlp_nodes(llama_dir, tmp_path):
    from attattr_cli.data.pairs import write_pairs

    data = tmp_path / "pairs.jsonl"
    write_pairs(data, _pairs())
    js = tmp_path / "c.json"
    r = run_cli("circuit", "--model", str(llama_dir), "--data", str(data), "--methods", "patching,atp",
                "--nodes", "heads+mlp", "--json", str(js), "--bootstrap", "20", "-q")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(js.read_text())
    assert doc["nodes"] == "heads+mlp" and len(doc["methods"]["atp"]["scores"]) == 2 * 5
    r = run_cli("circuit", "--model", str(llama_dir), "--data", str(data), "--methods", "attention",
                "--nodes", "heads+mlp", "-q")
    assert r.exit_code == 2
    one_error_line(r, "attention", "heads only")


# -- MIB's split and the recommendation -------------------------------------------------------
def test_split_methods_see_only_their_pairs_and_the_curve_only_the_others(loaded, monkeypatch):
    """With a split, every method (and any choice among candidates it makes) is computed on the
    fit pairs only, and the curve, its ends and intervals on the eval pairs only; ``none`` is
    the same-pairs evaluation."""
    import attattr_cli as aa
    from attattr_cli.analysis.circuits import REGISTRY, registry
    from attattr_cli.analysis.circuits.split import split_pairs

    seen = {}
    real = REGISTRY["atp"]

    def spy(ctx):
        seen["prompts"] = [p.prompt for p in ctx.task.pairs]
        return real.compute(ctx)

    monkeypatch.setitem(REGISTRY._entries, "atp", registry.HeadMethod(**{**real.__dict__, "compute": spy}))
    pairs = _pairs()
    res = aa.circuit(loaded, pairs, methods="atp", split="half", seed=3, bootstrap=20)
    parts = split_pairs(len(pairs), "half", 3)
    assert res.split["fit"] == list(parts.fit) and res.split["eval"] == list(parts.eval)
    assert seen["prompts"] == [pairs[i].prompt for i in parts.fit]
    assert res.n_pairs == len(parts.eval) and res.methods["atp"].per_pair.shape[0] == len(parts.fit)
    # the curve's ends are the eval pairs' own
    from attattr_cli.analysis.ablation import ends
    from attattr_cli.analysis.circuits.task import CircuitTask, Context

    clean, empty = ends(Context(CircuitTask(loaded, [pairs[i] for i in parts.eval])))
    assert res.clean == pytest.approx(clean.mean()) and res.empty == pytest.approx(empty.mean())
    same = aa.circuit(loaded, pairs, methods="atp", split="none", bootstrap=20)
    assert same.split["same_pairs"] and same.n_pairs == 4 and seen["prompts"] == [p.prompt for p in pairs]
    assert "no split" in repr(same) and "methods on 2 pairs, curve on 2" in repr(res)


def test_split_is_seeded_disjoint_and_refuses_what_cannot_be_split():
    from attattr_cli.analysis.circuits.split import split_pairs
    from attattr_cli.errors import OptionError

    a, b = split_pairs(33, "half", 7), split_pairs(33, "half", 7)
    assert a == b and len(a.fit) == 16 and len(a.eval) == 17 and not set(a.fit) & set(a.eval)
    assert split_pairs(33, "half", 8).fit != a.fit
    assert len(split_pairs(10, "0.3", 0).fit) == 3
    assert split_pairs(5, "none", 0).fit == split_pairs(5, "none", 0).eval == tuple(range(5))
    for bad in ("0", "1", "-0.5", "most"):
        with pytest.raises(OptionError):
            split_pairs(10, bad, 0)
    with pytest.raises(OptionError, match="cannot be split"):
        split_pairs(1, "half", 0)


def test_atp_verified_keeps_the_signed_order_and_chooses_the_interleaving_by_the_curve(loaded):
    """atp-verified: the signed order is verified AtP's (so Spearman and CPR do not depend on the
    interleaving); the negative heads' magnitudes are scaled by the candidate the curve measures
    nearest 1 on the method's own pairs."""
    from attattr_cli.analysis.circuits import REGISTRY, tiers, verified

    ctx = _ctx(loaded)
    got = REGISTRY["atp-verified"].compute(ctx)
    assert np.allclose(got, got[0])
    _, atp, inner = tiers.verified_estimates(ctx)
    exact = REGISTRY["patching"].compute(_ctx(loaded)).mean(0)
    np.testing.assert_allclose(inner[:tiers.EXACT_LAYERS], exact[:tiers.EXACT_LAYERS])  # the first layer: exact
    cands = [verified.interleaved(inner, c) for c in verified.SCALES]
    best = ctx.choose(cands, verified.CHECKED)
    np.testing.assert_array_equal(got[0], cands[best])
    for c in cands:  # the same signed order whatever the scale
        assert (np.argsort(-c.ravel(), kind="stable") == np.argsort(-inner.ravel(), kind="stable")).all()
    assert ctx.cache["atp-verified scale"] == verified.SCALES[best]


def test_verify_sets_how_many_heads_are_patched_exactly(loaded, monkeypatch):
    from attattr_cli.analysis.circuits import tiers

    asked = []
    real = tiers.patched_heads
    monkeypatch.setattr(tiers, "patched_heads", lambda ctx, heads: asked.append(list(heads)) or real(ctx, heads))
    monkeypatch.setattr(tiers, "EXACT_LAYERS", 0)
    monkeypatch.setattr(tiers, "DISAGREE", 0)
    for k in (0, 3, 5):
        tiers.verified_estimates(_ctx(loaded, verify=k))
        assert len(asked[-1]) == k


def test_the_written_defaults_are_the_registry_s():
    """The CLI's help and the API's docstring name the registry's default methods, in its order."""
    import inspect

    import attattr_cli as aa
    from attattr_cli.analysis.circuits import DEFAULT, RECOMMENDED
    import importlib

    cli_circuit = importlib.import_module("attattr_cli.cli.circuit")

    words = "default: " + ", ".join(DEFAULT)
    assert DEFAULT[0] == RECOMMENDED and words in inspect.getdoc(aa.circuit).replace("\n", " ")
    help_text = next(p.default.help for p in inspect.signature(cli_circuit.circuit).parameters.values()
                     if getattr(p.default, "help", None) and "Head methods" in p.default.help)
    assert words in help_text
