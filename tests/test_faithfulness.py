"""Faithfulness metrics on toy cases with known answers, token importance in the store,
and `attattr faithfulness` end to end on the built-in default."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch

from attattr_cli.analysis import faithfulness as fa
from attattr_cli.analysis import token_importance as ti
from attattr_cli.errors import OptionError, StoreError
from attattr_cli.store import Store, TokenImportanceStore, merge, read_token_importance
from conftest import one_error_line, run_cli



# -- Kendall tau-b ------------------------------------------------------------------------

def test_tau_b_without_ties():
    assert fa.kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert fa.kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # pairs of [1, 3, 2]: (1,3) C, (1,2) C, (3,2) D -> (2 - 1) / 3
    assert fa.kendall_tau_b([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_tau_b_with_ties_hand_computed():
    # x = 1 2 2 3, y = 1 3 2 4: five concordant pairs, the pair (1, 2) tied in x only;
    # untied pairs: 5 in x, 6 in y -> 5 / sqrt(30)
    assert fa.kendall_tau_b([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(5 / math.sqrt(30))
    # x = 1 1 2 2, y = 1 2 1 2: one concordant, one discordant, 4 untied in each -> 0
    assert fa.kendall_tau_b([1, 1, 2, 2], [1, 2, 1, 2]) == pytest.approx(0.0)
    # x = 3 1 2, y = 1 2 2: two discordant, 3 untied in x, 2 in y -> -2 / sqrt(6)
    assert fa.kendall_tau_b([3, 1, 2], [1, 2, 2]) == pytest.approx(-2 / math.sqrt(6))
    assert math.isnan(fa.kendall_tau_b([1, 1, 1], [1, 2, 3]))
    assert math.isnan(fa.kendall_tau_b([1], [2]))


def test_tau_b_agrees_with_scipy_on_random_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for _ in range(20):
        x, y = rng.integers(0, 4, 15), rng.integers(0, 5, 15)
        assert fa.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


# -- erasure on a toy model with a computable answer ---------------------------------------

# positions 0 and 11 are special tokens; the "model" is p = 0.1 + sum of the kept
# content tokens' weights, so every erasure has a known probability
WEIGHTS = np.array([0.0, 0.05, 0.3, 0.0, 0.02, 0.2, 0.04, 0.1, 0.01, 0.05, 0.03, 0.0])
CONTENT = np.arange(1, 11)


def _toy_predict(keeps):
    return np.array([0.1 + WEIGHTS[np.asarray(k)].sum() for k in keeps])


def test_bin_sizes():
    assert [fa.bin_size(q, 10) for q in fa.BINS] == [1, 1, 1, 2, 5]
    assert [fa.bin_size(q, 200) for q in fa.BINS] == [2, 10, 20, 40, 100]
    assert fa.bin_size(0.5, 1) == 1


def test_aopc_on_a_toy_model():
    perfect = WEIGHTS.copy()
    worst = -WEIGHTS
    out = fa.erasure_metrics(_toy_predict, 12, CONTENT, {"perfect": perfect, "worst": worst})
    # bins of 10 tokens: k = 1, 1, 1, 2, 5; top weights 0.3, 0.2, 0.1, 0.05, 0.05
    assert out["perfect"]["comprehensiveness_bins"] == pytest.approx([0.3, 0.3, 0.3, 0.5, 0.7])
    assert out["perfect"]["comprehensiveness"] == pytest.approx(0.42)
    # sufficiency: p(x) - p(only top k) = 0.8 - top-k sum
    assert out["perfect"]["sufficiency_bins"] == pytest.approx([0.5, 0.5, 0.5, 0.3, 0.1])
    assert out["perfect"]["sufficiency"] == pytest.approx(0.38)
    # the reverse ranking erases the least important first: 0.0 (pos 3), 0.01, 0.02, 0.03, 0.04
    assert out["worst"]["comprehensiveness_bins"] == pytest.approx([0.0, 0.0, 0.0, 0.01, 0.10])
    assert out["worst"]["comprehensiveness"] == pytest.approx(0.022)
    # deletion curve at f = 0, 0.1, ..., 1: 0.9 minus the cumulated top weights
    cum = np.concatenate([[0], np.cumsum(sorted(WEIGHTS[CONTENT], reverse=True))])
    assert out["perfect"]["deletion_curve"] == pytest.approx(list(0.9 - cum))
    assert out["perfect"]["deletion_auc"] == pytest.approx(np.trapezoid(0.9 - cum, fa.DELETION_FRACTIONS))
    assert out["perfect"]["deletion_auc"] < out["worst"]["deletion_auc"]


def test_ranking_breaks_ties_by_position():
    assert list(fa.ranking(np.array([9.0, 1.0, 2.0, 2.0, 1.0]), np.arange(1, 5))) == [2, 3, 1, 4]


# -- permutation and TVD -----------------------------------------------------------------

def test_total_variation():
    assert fa.total_variation([0.5, 0.5], [1.0, 0.0]) == pytest.approx(0.5)
    assert fa.total_variation([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]) == pytest.approx(0.0)
    assert fa.total_variation([1, 0, 0], [0, 0, 1]) == pytest.approx(1.0)


def test_permutation_index_keeps_causal_rows_in_the_past():
    idx = fa.permutation_index(3, 2, 6, True, torch.Generator().manual_seed(0))
    for i in range(6):
        row = idx[:, :, i]
        assert (row[..., i + 1:] == torch.arange(i + 1, 6)).all()
        assert (row[..., :i + 1].sort(-1).values == torch.arange(i + 1)).all()
    full = fa.permutation_index(2, 2, 5, False, torch.Generator().manual_seed(0))
    assert (full.sort(-1).values == torch.arange(5)).all()


def _example(tokenizer, loaded):
    enc = tokenizer("w1 w2 w3 w4 w5", "w6 w7 w8")
    seg = [-1 if s is None else s for s in enc.sequence_ids()]
    n = len(enc["input_ids"])
    return ti.Prepared(0, np.array(enc["input_ids"]), np.array(enc["token_type_ids"]), np.array(seg), 1,
                       ti.pool_position(n, loaded.arch.is_decoder))


def test_permutation_of_uniform_attention_changes_nothing(loaded_factory, tokenizer):
    loaded = loaded_factory("bert", dtype=torch.float64)
    attn = loaded.model.bert.encoder.layer[1].attention.self
    with torch.no_grad():  # zero queries: every row of layer 1 attends uniformly
        attn.query.weight.zero_()
        attn.query.bias.zero_()
    run = ti.ModelRunner(loaded)
    ex = _example(tokenizer, loaded)
    tv = fa.permutation_tvd(run, ex, [0, 1], permutations=5)
    assert tv.shape == (2, 5)
    assert np.abs(tv[1]).max() < 1e-12  # a permutation of a uniform row is the same row
    assert tv[0].max() > 1e-7  # an ordinary layer's output does change


def test_identity_permutation_is_the_clean_forward(loaded_factory, tokenizer):
    from attattr_cli.engine import attention

    loaded = loaded_factory("gpt2")
    ex = _example(tokenizer, loaded)
    ids = torch.tensor([list(ex.input_ids)])
    n = ex.n
    same = torch.arange(n).expand(1, 4, n, n)
    with attention.taken_over(loaded.model), torch.no_grad():
        clean = loaded.model(input_ids=ids).logits
        with attention.active(attention.Permute(1, same)):
            permuted = loaded.model(input_ids=ids).logits
    assert torch.allclose(clean, permuted, atol=1e-6)
    run = ti.ModelRunner(loaded)
    assert fa.permutation_tvd(run, ex, [2], 4).max() > 0


# -- token importance ------------------------------------------------------------------------

def test_attention_methods_on_known_matrices():
    eye = np.broadcast_to(np.eye(3), (2, 2, 3, 3))
    assert ti.rollout(eye, 0) == pytest.approx([1, 0, 0])
    uniform = np.full((1, 1, 3, 3), 1 / 3)
    # 0.5 * uniform + 0.5 * I, row 0: [2/3, 1/6, 1/6]
    assert ti.rollout(uniform, 0) == pytest.approx([2 / 3, 1 / 6, 1 / 6])
    two = np.concatenate([uniform, uniform])
    m = np.full((3, 3), 1 / 6) + 0.5 * np.eye(3)
    assert ti.rollout(two, 0) == pytest.approx((m @ m)[0])
    att = np.random.default_rng(0).dirichlet(np.ones(4), size=(2, 3, 4))  # [L, H, q, k]
    assert ti.attention_last(att, 0) == pytest.approx(att[-1, :, 0].mean(0))
    assert ti.attention_mean(att, 3) == pytest.approx(att[:, :, 3].mean((0, 1)))
    assert ti.attn_grad(att, np.zeros_like(att), 0) == pytest.approx([1, 0, 0, 0])
    grads = -np.ones_like(att)  # relu(A * g) = 0 everywhere
    assert ti.attn_grad(att, grads, 2) == pytest.approx([0, 0, 1, 0])
    g = np.ones_like(att)  # relu(A) = A: R = prod (I + mean_h A)
    r = np.eye(4)
    for layer in att:
        r = r + layer.mean(0) @ r
    assert ti.attn_grad(att, g, 1) == pytest.approx(r[1])
    attr = np.random.default_rng(1).normal(size=(2, 3, 4, 4))
    assert ti.attr_columns(attr).sum() == pytest.approx(attr.sum())
    assert ti.attr_pooled(attr, 0) == pytest.approx(attr[:, :, 0].sum((0, 1)))
    assert ti.random_scores(5, 0, 7) == pytest.approx(ti.random_scores(5, 0, 7))
    assert not np.allclose(ti.random_scores(5, 0, 7), ti.random_scores(5, 1, 7))


def test_gradient_methods_and_loo_against_direct_computation(loaded_factory, tokenizer):
    loaded = loaded_factory("bert")
    run = ti.ModelRunner(loaded)
    ex = _example(tokenizer, loaded)
    s = run.compute(ex, ["grad", "input_x_grad", "loo", "attention_last"])
    model = loaded.model
    ids = torch.tensor([list(ex.input_ids)])
    tt = torch.tensor([list(ex.token_type_ids)])
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with torch.enable_grad():
        p = torch.softmax(model(inputs_embeds=emb, token_type_ids=tt).logits, -1)[0, ex.target]
        (g,) = torch.autograd.grad(p, emb)
    assert s["grad"] == pytest.approx(g[0].norm(dim=-1).numpy(), rel=1e-4, abs=1e-7)
    assert s["input_x_grad"] == pytest.approx((g[0] * emb[0]).sum(-1).detach().numpy(), rel=1e-4, abs=1e-7)
    with torch.no_grad():
        p0 = float(torch.softmax(model(input_ids=ids, token_type_ids=tt).logits, -1)[0, 1])
        j = 3
        keep = [i for i in range(ex.n) if i != j]
        pj = float(torch.softmax(model(input_ids=ids[:, keep], token_type_ids=tt[:, keep]).logits, -1)[0, 1])
        att = model(input_ids=ids, token_type_ids=tt, output_attentions=True)
    assert s["loo"][j] == pytest.approx(p0 - pj, abs=1e-6)
    masked = ti.ModelRunner(loaded, erase="mask").loo(ex)
    assert masked.shape == (ex.n,) and not np.allclose(masked, s["loo"])
    with pytest.raises(OptionError, match="unknown token importance method 'nope'"):
        ti.check_methods(["grad", "nope"])


# -- the store -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    d = tmp_path_factory.mktemp("faith")
    out = d / "s.h5"
    r = run_cli("score", "--out", out, "--examples", "0:3", "--steps", "2", "-q")
    assert r.exit_code == 0, r.output
    return out


def test_store_round_trip_and_reuse(scored, tmp_path):
    path = tmp_path / "s.h5"
    path.write_bytes(scored.read_bytes())
    opts = fa.FaithfulnessOptions(permutations=2)
    first = fa.evaluate_store(path, opts, keep=True)  # asked to keep the vectors in the store
    with Store(path) as s:
        for i in s.indices():
            stored = read_token_importance(s, i)
            assert set(stored) == set(ti.METHODS)
            assert all(v.shape == (len(s.get(i, arrays=False).tokens),) for v in stored.values())
        e = s.get(0)  # old readers see the example as before
        assert e.attribution.shape[0] == 3
    again = fa.evaluate_store(path, fa.FaithfulnessOptions(permutations=2))  # read back, not written
    assert again["forwards"] < first["forwards"]  # importance read back, not recomputed
    for m in ti.METHODS:
        assert again["methods"][m]["tau_loo"] == pytest.approx(first["methods"][m]["tau_loo"], nan_ok=True)
        assert again["methods"][m]["comprehensiveness"] == pytest.approx(first["methods"][m]["comprehensiveness"])
    assert first["methods"]["loo"]["tau_loo"] == pytest.approx(1.0)
    assert first["methods"]["loo"]["tau_loo_abs"] == pytest.approx(1.0)  # magnitudes against magnitudes
    assert first["methods"]["grad"]["tau_grad"] == pytest.approx(1.0)
    # intervals beside the standard errors; paired tests attr vs each attention baseline
    from attattr_cli.analysis import stats

    for m in ti.METHODS:
        r = first["methods"][m]
        assert r["comprehensiveness_low"] <= r["comprehensiveness"] <= r["comprehensiveness_high"]
    tests = first["paired_tests"]
    assert {(t["method"], t["baseline"]) for t in tests} == {
        (a, b) for a in ("attr", "attr_cls") for b in ti.METHODS if b not in ("attr", "attr_cls")}
    assert not any(t["baseline"] == "loo" and t["metric"].startswith("tau_loo") for t in tests)
    assert not any(t["baseline"] == "grad" and t["metric"] == "tau_grad" for t in tests)
    t = next(t for t in tests if (t["method"], t["baseline"], t["metric"]) == ("attr", "rollout", "sufficiency"))
    x = [r["erasure"]["attr"]["sufficiency"] for r in first["per_example"]]
    y = [r["erasure"]["rollout"]["sufficiency"] for r in first["per_example"]]
    assert t["difference"] == pytest.approx(np.mean(x) - np.mean(y))
    assert t["p"] == pytest.approx(stats.paired_test(x, y, "less")["p"]) and t["better"] == "lower"
    assert [u["p_holm"] for u in tests] == pytest.approx(stats.holm([u["p"] for u in tests]))
    assert again["paired_tests"] == tests  # seeded
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(StoreError, match="holds 'random' token importance made with other settings"):
        fa.evaluate_store(path, fa.FaithfulnessOptions(methods=["random"], seed=5, permutations=0))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # refused untouched
    with TokenImportanceStore(path) as w:
        assert w.stored(0, "random", ti.params_for("random", "prob", "remove", 0)) is not None
    merged = tmp_path / "m.h5"
    merge([path], merged)
    with Store(merged) as s:
        assert set(read_token_importance(s, 1)) == set(ti.METHODS)


def _leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


@pytest.mark.parametrize("erase", ["remove", "mask"])
def test_batched_forwards_give_the_numbers_of_one_sequence_per_pass(scored, tmp_path, erase):
    """Every forward of every metric (leave-one-out, erasure, masking, permutations) of
    several examples in shared passes: the numbers of one sequence per pass, to float64
    rounding, in far fewer passes."""
    from attattr_cli.models.default import DEFAULT_MODEL_DIR
    from attattr_cli.models.loading import load

    loaded = load(str(DEFAULT_MODEL_DIR), device="cpu", dtype="float64")
    passes = {"n": 0}
    forward = loaded.model.forward

    def counted(*a, **k):
        passes["n"] += 1
        return forward(*a, **k)

    loaded.model.forward = counted
    reports, counts, stored = {}, {}, {}
    ways = ((0, 1), (0, ti.MAX_TOKENS), (2, ti.MAX_TOKENS), (16, ti.MAX_TOKENS))
    if erase == "mask":  # the erase mode changes which sequences run, not how they are grouped
        ways = ((0, 1), (16, ti.MAX_TOKENS))
    for be, mt in ways:
        path = tmp_path / f"s{be}_{mt}.h5"
        path.write_bytes(scored.read_bytes())
        passes["n"] = 0
        reports[be, mt] = fa.evaluate_store(path, fa.FaithfulnessOptions(permutations=3, erase=erase), loaded=loaded,
                                            batch_examples=be, max_tokens=mt, keep=True)
        counts[be, mt] = passes["n"]
        with Store(path) as st:  # the token importance itself (kept as float32)
            stored[be, mt] = {i: read_token_importance(st, i) for i in st.indices()}
    for key, got in stored.items():
        for i, methods in got.items():
            assert set(methods) == set(ti.METHODS)
            for m, v in methods.items():
                np.testing.assert_allclose(v, stored[0, 1][i][m], rtol=1e-6, atol=1e-7, err_msg=f"{key} {i} {m}")
    one = dict(_leaves(reports[0, 1]["per_example"]))
    assert any(k.endswith("aopc") for k in one) and any("permutation" in k for k in one)
    for key, rep in reports.items():
        other = dict(_leaves(rep["per_example"]))
        assert other.keys() == one.keys()
        for k, v in one.items():
            if isinstance(v, float) and math.isfinite(v):
                assert other[k] == pytest.approx(v, abs=1e-9), (key, k)
            else:
                assert other[k] == v or (v != v and other[k] != other[k]), (key, k)
    # one sequence per pass; then each metric's inputs grouped by length; then the
    # examples' inputs together
    assert counts[0, 1] > 9 * counts[16, ti.MAX_TOKENS]
    if erase == "remove":
        assert counts[0, 1] > 3 * counts[0, ti.MAX_TOKENS] > 3 * counts[16, ti.MAX_TOKENS]
        assert counts[16, ti.MAX_TOKENS] <= counts[2, ti.MAX_TOKENS]


def test_permutation_index_is_torchs_argsort_of_the_same_draws():
    for causal in (False, True):
        idx = fa.permutation_index(4, 3, 7, causal, torch.Generator().manual_seed(5))
        r = torch.rand(4, 3, 7, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        if causal:
            j = torch.arange(7, dtype=torch.float64)
            r = torch.where(j[None, :] > j[:, None], 2.0 + j.expand(7, 7), r)
        assert torch.equal(idx, r.argsort(-1))


# -- the command -------------------------------------------------------------------------------

def test_cli_end_to_end_on_builtin_default(tmp_path):
    report = tmp_path / "r.json"
    png = tmp_path / "r.png"
    r = run_cli("faithfulness", "--out", report, "--examples", "0:3", "--steps", "2", "--permutations", "3",
                "--plot", png)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(report)
    assert "τ with LOO" in r.stderr and "τ |·| with |LOO|" in r.stderr and "attn_grad" in r.stderr and "permutation test" in r.stderr
    assert "paired tests on the same examples" in r.stderr and "bootstrap interval" in r.stderr
    data = json.loads(report.read_text())
    assert data["examples"] == 3 and set(data["methods"]) == set(ti.METHODS)
    assert data["task"] == "synthetic" and len(data["permutation"]["layers"]) == 3
    as_csv = run_cli("faithfulness", str(tmp_path / "r.h5"), "--out", tmp_path / "r2.json", "--permutations", "0",
                     "--csv", "-q")  # the rows on stdout, as every command's --csv
    assert as_csv.exit_code == 0, as_csv.output
    assert len(as_csv.stdout.strip().splitlines()) == 1 + len(ti.METHODS)
    assert png.read_bytes()[:4] == b"\x89PNG"
    store = tmp_path / "r.h5"
    again = tmp_path / "again.json"
    r2 = run_cli("faithfulness", store, "--out", again, "--permutations", "3", "--methods", "attr,random", "-q")
    assert r2.exit_code == 0, r2.output
    d2 = json.loads(again.read_text())
    assert list(d2["methods"]) == ["attr", "random"]
    assert d2["methods"]["attr"]["tau_loo"] == pytest.approx(data["methods"]["attr"]["tau_loo"])
    assert d2["permutation"]["median_tvd_mean"] == pytest.approx(data["permutation"]["median_tvd_mean"])


def test_cli_errors_are_one_line_and_keep_outputs(tmp_path, tiny_model_dir, other_model_dir, sst2_small):
    report = tmp_path / "r.json"
    report.write_text("keep me")
    one_error_line(run_cli("faithfulness", "--out", report, "--methods", "attention,grad"),
                   "unknown token importance method 'attention'")
    one_error_line(run_cli("faithfulness", tmp_path / "none.h5", "--out", report), "no such store")
    one_error_line(run_cli("faithfulness", "--out", report, "--erase", "zero"), "unknown --erase 'zero'")
    one_error_line(run_cli("faithfulness", "--out", report, "--plot", tmp_path / "p.gif"), "cannot tell the format")
    one_error_line(run_cli("faithfulness", "--out", tmp_path / "no" / "r.json"), "the folder")
    store = tmp_path / "tiny.h5"
    ok = run_cli("faithfulness", "--out", tmp_path / "tiny.json", "--store", store, "--model", tiny_model_dir,
                 "--data", sst2_small, "--task", "sst2", "--examples", "0:2", "--steps", "2", "--permutations", "2", "-q")
    assert ok.exit_code == 0, ok.output
    digest = hashlib.sha256(store.read_bytes()).hexdigest()
    one_error_line(run_cli("faithfulness", store, "--model", other_model_dir, "--out", report),
                   "was made with another model")
    assert hashlib.sha256(store.read_bytes()).hexdigest() == digest
    assert report.read_text() == "keep me"


def test_report_is_strict_json():
    from attattr_cli.fileio import strict_json

    assert strict_json({"a": float("nan"), "b": [1.0, float("inf")], "c": (2,)}) == {"a": None, "b": [1.0, None], "c": [2]}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "distilbert"])
def test_every_method_runs_on_other_families(loaded_factory, tokenizer, kind):
    loaded = loaded_factory(kind)
    run = ti.ModelRunner(loaded)
    ex = _example(tokenizer, loaded)
    if kind != "distilbert" and loaded.arch.is_decoder:
        assert ex.pool == ex.n - 1
    methods = [m for m in ti.METHODS if m not in ti.ATTRIBUTION_METHODS]
    scores = run.compute(ex, methods)
    assert all(scores[m].shape == (ex.n,) and np.isfinite(scores[m]).all() for m in methods)
    assert scores["attention_last"].sum() == pytest.approx(1.0)
    if loaded.arch.is_decoder:  # the last token cannot attend to the future: nothing past it
        assert scores["rollout"].sum() == pytest.approx(1.0)
    tv = fa.permutation_tvd(run, ex, [0, loaded.arch.num_layers - 1], 3)
    assert tv.shape == (2, 3) and (tv >= 0).all() and (tv <= 1).all()


def _md5(path) -> str:
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_the_store_read_is_never_changed_and_may_be_read_only(scored, tmp_path):
    """faithfulness STORE leaves STORE bit-identical, also on a read-only file in a read-only
    folder; --importance-store keeps the vectors in a copy that the next run reads back."""
    folder = tmp_path / "ro"
    folder.mkdir()
    store = folder / "s.h5"
    store.write_bytes(scored.read_bytes())
    before = _md5(store)
    store.chmod(0o444)
    folder.chmod(0o555)
    try:
        first = run_cli("faithfulness", store, "--out", tmp_path / "a.json", "--permutations", 0,
                        "--methods", "attr,grad")
        assert first.exit_code == 0, first.output
        assert "token importance kept" not in first.stderr
        assert _md5(store) == before
        import attattr_cli as aa

        res = aa.faithfulness(store, methods=["attr"], permutations=0)
        assert res.store is None and _md5(store) == before
        kept = tmp_path / "kept.h5"
        second = run_cli("faithfulness", store, "--out", tmp_path / "b.json", "--permutations", 0,
                         "--methods", "attr,grad", "--importance-store", kept)
        assert second.exit_code == 0, second.output
        assert f"token importance kept in {kept}" in second.stderr and _md5(store) == before
        with Store(kept) as s:
            assert {"attr", "grad", "loo"} <= set(read_token_importance(s, 0))
        third = aa.faithfulness(store, methods=["attr", "grad"], permutations=0, importance_store=kept)
        a, c = json.loads((tmp_path / "a.json").read_text()), third.report
        assert c["forwards"] < a["forwards"]  # read back from the importance store
        assert c["methods"]["attr"]["tau_loo"] == pytest.approx(a["methods"]["attr"]["tau_loo"])
        assert _md5(store) == before
        one_error_line(run_cli("faithfulness", store, "--out", store, "--permutations", 0), "same file as an input")
    finally:
        folder.chmod(0o755)
        store.chmod(0o644)


def test_attention_methods_alone_score_no_layer_and_run(tmp_path):
    """Methods that need no attribution score the examples with no layer (predictions and
    attention only): that used to be refused as 'layers that compute no softmax attention'."""
    import attattr_cli as aa

    r = aa.faithfulness(model=None, examples="0:3", methods="attention_last", permutations=2,
                        score_store=tmp_path / "s.h5")
    assert list(r.methods) == ["attention_last"] and r.report["examples"] == 3
    with aa.open_store(tmp_path / "s.h5") as st:
        assert len(st) == 3
