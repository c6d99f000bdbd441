"""Pruning: rates and rankings, curves against a direct evaluation, real pruning, refusals, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attattr_cli.analysis import importance as imp
from attattr_cli.analysis import prune as pr
from attattr_cli.cli import app
from attattr_cli.data import get_task, load_examples
from attattr_cli.engine.heads import Batches, logits_under
from attattr_cli.errors import ModelError, OptionError
from conftest import one_error_line

runner = CliRunner()


def test_rates_ranking_and_masks():
    assert pr.parse_rates("0:1:0.1") == [round(0.1 * i, 10) for i in range(11)]
    assert pr.parse_rates("0,0.5,0.7") == [0, 0.5, 0.7]
    for bad in ("0:2:0.5", "a,b", "0:1:0", ""):
        with pytest.raises(OptionError, match="--rates"):
            pr.parse_rates(bad)
    v = np.array([[0.5, 0.1, 0.9], [0.3, 0.3, 0.8]])
    assert pr.ranking(v).tolist() == [1, 3, 4, 0, 5, 2]  # ties by index
    m = pr.mask_at(v, 0.5)
    assert m.tolist() == [[1, 0, 1], [0, 0, 1]]
    assert pr.mask_at(v, 0).sum() == 6 and pr.mask_at(v, 1).sum() == 0
    assert pr.kept_heads(v, 0.5) == [[0, 2], [2]]


def _setup(tiny_model_dir, sst2_small):
    from attattr_cli.models.loading import align_labels, load

    loaded = load(str(tiny_model_dir), device="cpu")
    examples, labels = load_examples(str(sst2_small), get_task("sst2"))
    label_map = align_labels(labels, loaded)[0]
    return loaded, examples, label_map, Batches(loaded, examples, label_map, batch_size=3)


def _imp_file(loaded, tmp_path, tables):
    return imp.write(tmp_path / "imp.h5", imp.identity_of(loaded), tables)


def test_curves_equal_a_direct_evaluation(tmp_path, tiny_model_dir, sst2_small):
    loaded, examples, label_map, batches = _setup(tiny_model_dir, sst2_small)
    rng = np.random.default_rng(7)
    t = imp.Table("taylor", "taylor", rng.random((3, 4)))
    f = _imp_file(loaded, tmp_path, [t] + [imp.random_table(3, 4, s) for s in (0, 1, 2)])
    rates = [0.0, 0.25, 0.5, 1.0]
    c = pr.curves(loaded, batches, f, rates, "sst2")
    gold = torch.tensor([label_map[e.label] for e in examples])
    for i, r in enumerate(rates):
        k = int(round(r * 12))
        order = np.argsort(t.values.ravel(), kind="stable")[:k]
        mask = torch.ones(12)
        mask[torch.as_tensor(order)] = 0
        acc = 0
        for e, g in zip(examples, gold):  # one example at a time, mask built by hand
            b = Batches(loaded, [e], label_map, 1)
            acc += int(logits_under(loaded, b, mask.view(3, 4)).argmax(-1)[0] == g)
        assert c["methods"]["taylor"]["accuracy"][i] == pytest.approx(acc / len(examples))
    with torch.no_grad():
        base = logits_under(loaded, batches, None).argmax(-1)
    assert c["baseline"]["accuracy"] == pytest.approx(float((base == gold).float().mean()))
    assert c["methods"]["taylor"]["accuracy"][0] == c["baseline"]["accuracy"]
    rnd = c["methods"]["random"]
    assert set(rnd["tables"]) == {"random-0", "random-1", "random-2"}
    np.testing.assert_allclose(rnd["accuracy"], np.mean([v["accuracy"] for v in rnd["tables"].values()], axis=0))
    assert c["methods"]["taylor"]["heads_masked"] == [0, 3, 6, 12]


def test_many_masks_per_pass_are_one_mask_per_pass(tmp_path, tiny_model_dir, sst2_small):
    """Head masks evaluated several per pass (shared and per-example masks): the logits of
    one mask per pass to float64 rounding, and the same curves and effectiveness tables."""
    from attattr_cli.models.loading import load

    _, examples, label_map, _ = _setup(tiny_model_dir, sst2_small)
    loaded = load(str(tiny_model_dir), device="cpu", dtype="float64")
    batches = Batches(loaded, examples, label_map, batch_size=3)
    rng = np.random.default_rng(11)
    shared = [pr.mask_at(rng.random((3, 4)), r) for r in (0.0, 0.25, 0.5, 0.75)]
    own = [torch.as_tensor(rng.random((len(examples), 3, 4)) > 0.4, dtype=torch.float32) for _ in range(3)]
    masks = shared + own
    passes = {"n": 0}
    forward = loaded.model.forward

    def counted(*a, **k):
        passes["n"] += 1
        return forward(*a, **k)

    loaded.model.forward = counted
    many = pr.logits_under_masks(loaded, batches, masks)
    assert passes["n"] == len(batches.batches)  # every mask in one pass per batch of examples
    one = pr.logits_under_masks(loaded, batches, masks, max_tokens=1)
    assert passes["n"] == len(batches.batches) * (1 + len(masks))
    for m, a, b in zip(masks, many, one):
        direct = logits_under(loaded, batches, m if m.dim() == 2 else None,
                              per_example=None if m.dim() == 2 else (lambda bt, _m=m: _m[bt.positions]))
        assert a.shape == (len(examples), direct.shape[-1])
        torch.testing.assert_close(a, direct, rtol=0, atol=1e-6)  # float32 logits of a float64 model
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    t = imp.Table("taylor", "taylor", rng.random((3, 4)))
    f = _imp_file(loaded, tmp_path, [t, imp.random_table(3, 4, 0)])
    rates = [0.0, 0.25, 0.5]
    assert pr.curves(loaded, batches, f, rates, "sst2") == pr.curves(loaded, batches, f, rates, "sst2", max_tokens=1)
    attr, attn = rng.random((len(examples), 3, 4)), rng.random((len(examples), 3, 4))
    assert pr.effectiveness(loaded, batches, attr, attn, [2, 4], "sst2") == \
        pr.effectiveness(loaded, batches, attr, attn, [2, 4], "sst2", max_tokens=1)


def test_really_pruned_model_reloads_with_the_masked_logits(tmp_path, tiny_model_dir, sst2_small):
    from transformers import AutoModelForSequenceClassification

    loaded, examples, label_map, batches = _setup(tiny_model_dir, sst2_small)
    values = np.array([[0.1, 0.2, 0.05, 0.15],  # layer 0: every head below the rest -> no head left
                       [0.9, 0.3, 0.8, 0.7],
                       [0.6, 0.95, 0.4, 0.5]])
    keep = 0.5
    kept = pr.kept_heads(values, keep)
    assert kept == [[], [0, 2, 3], [0, 1, 3]]
    out = tmp_path / "pruned"
    pr.save_pruned(loaded.model, loaded.tokenizer, kept, out)
    assert (out / "model.safetensors").exists() and (out / "modeling_attattr_pruned.py").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["attattr_kept_heads"] == kept
    assert cfg["architectures"] == ["AttattrPrunedBertForSequenceClassification"]
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(out), trust_remote_code=True).eval()
    assert reloaded.bert.encoder.layer[1].attention.self.query.weight.shape == (3 * 8, 32)
    assert reloaded.bert.encoder.layer[1].attention.output.dense.weight.shape == (32, 3 * 8)
    assert pr.count_params(reloaded) < pr.count_params(loaded.model)
    masked = logits_under(loaded, batches, pr.mask_at(values, 1 - keep))
    with torch.no_grad():
        real = torch.empty_like(masked)
        for b in batches.batches:
            real[b.positions] = reloaded(**b.inputs).logits
    torch.testing.assert_close(real, masked, atol=1e-5, rtol=1e-5)
    unmasked = logits_under(loaded, batches, None)
    assert (unmasked - masked).abs().max() > 1e-4
    # attattr's own masking also runs on the pruned model (its attention goes through the interface)
    from attattr_cli.engine.heads import masked as masked_ctx

    with torch.no_grad(), masked_ctx(reloaded, torch.ones(3, 3)):
        torch.testing.assert_close(reloaded(**batches.batches[0].inputs).logits, real[batches.batches[0].positions],
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(OptionError, match="not empty"):
        pr.save_pruned(loaded.model, loaded.tokenizer, kept, out)


def test_non_bert_models_are_refused(loaded_factory, tmp_path):
    loaded = loaded_factory("gpt2")
    with pytest.raises(ModelError, match="BERT-family"):
        pr.save_pruned(loaded.model, loaded.tokenizer, [[0], [0], [0]], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_bad_importance_files_are_refused(tmp_path, tiny_model_dir, other_model_dir, sst2_small):
    from attattr_cli.models.loading import load

    other = load(str(other_model_dir), device="cpu")
    imp.write(tmp_path / "other.h5", imp.identity_of(other), [imp.random_table(3, 4, 0)])
    loaded = load(str(tiny_model_dir), device="cpu")
    ident = imp.identity_of(loaded)
    shape = imp.Identity(ident.weights_sha256, ident.model, "bert", 2, 4)
    imp.write(tmp_path / "shape.h5", shape, [imp.random_table(2, 4, 0)])
    (tmp_path / "junk.h5").write_text("not hdf5")
    out = tmp_path / "curves.json"
    out.write_text("{}")
    args = ["prune", "--model", str(tiny_model_dir), "--data", str(sst2_small), "--task", "sst2", "--out", str(out)]
    one_error_line(runner.invoke(app, args + ["--importance", str(tmp_path / "other.h5")]), "another model")
    one_error_line(runner.invoke(app, args + ["--importance", str(tmp_path / "shape.h5")]), "2 layers x 4 heads", "3 x 4")
    one_error_line(runner.invoke(app, args + ["--importance", str(tmp_path / "junk.h5")]), "not an HDF5 importance file")
    one_error_line(runner.invoke(app, args + ["--importance", str(tmp_path / "none.h5")]), "no such importance file")
    one_error_line(runner.invoke(app, args + ["--importance", str(tmp_path / "other.h5"), "--keep", "0.5"]), "--save-model")
    store = tmp_path / "default.h5"  # a store of the built-in model is not one of --model
    assert runner.invoke(app, ["score", "--out", str(store), "--examples", "0:2", "--steps", "2", "-q"]).exit_code == 0
    one_error_line(runner.invoke(app, args + ["--effectiveness", str(store)]), "another model")
    assert out.read_text() == "{}"


def test_prune_cli_builtin_default_curves_effectiveness_and_save(tmp_path):
    store = tmp_path / "s.h5"
    r = runner.invoke(app, ["score", "--out", str(store), "--examples", "0:12", "--steps", "4", "-q"])
    assert r.exit_code == 0, r.output
    impf = tmp_path / "imp.h5"
    assert runner.invoke(app, ["importance", str(store), "--out", str(impf), "-q"]).exit_code == 0
    r = runner.invoke(app, ["importance", "--method", "random", "--seeds", "0,1", "--out", str(impf), "-q"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "curves.json"
    r = runner.invoke(app, ["prune", "--importance", str(impf), "--examples", "0:60", "--rates", "0,0.5,1",
                            "--effectiveness", str(store), "--keep", "0.5", "--save-model", str(tmp_path / "pm"),
                            "--out", str(out), "--plot", str(tmp_path / "c.png"), "-q"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out)
    res = json.loads(out.read_text())
    c = res["curves"]
    assert list(c["methods"]) == ["attr", "attention", "random"]
    assert c["rates"] == [0, 0.5, 1] and c["n_examples"] == 60
    for entry in c["methods"].values():
        assert entry["accuracy"][0] == c["baseline"]["accuracy"]
    e = res["effectiveness"]
    assert e["ks"] == [2, 4] and e["n_examples"] == 12
    assert set(e["orders"]) == {"attr_small_first", "attr_large_first", "attention_small_first", "attention_large_first"}
    # k = all heads of the layer: every order masks the same heads
    assert len({round(v["accuracy"][-1], 9) for v in e["orders"].values()}) == 1
    for v in e["orders"].values():
        assert all(lo <= a <= hi for lo, a, hi in zip(v["accuracy_low"], v["accuracy"], v["accuracy_high"]))
    for side in ("small_first", "large_first"):
        t = e["orders"][f"attr_{side}"]["test_vs_attention"]
        assert len(t["p"]) == 2 and t["difference"][-1] == 0.0 and t["p"][-1] == 1.0  # same heads: no difference
    p = res["pruned_model"]
    assert p["heads_kept"] == 6 and p["params_pruned"] < p["params_unpruned"]
    assert p["max_abs_logit_diff_vs_masked"] < 1e-4 and p["agreement_vs_masked"] == 1.0
    assert "pruned model:" in r.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_curve_bands_and_paired_tests(tmp_path, tiny_model_dir, sst2_small):
    from attattr_cli.analysis import stats

    loaded, examples, label_map, batches = _setup(tiny_model_dir, sst2_small)
    rng = np.random.default_rng(3)
    tables = [imp.Table("attr", "attr", rng.random((3, 4))), imp.Table("attention", "attention", rng.random((3, 4)))]
    f = _imp_file(loaded, tmp_path, tables + [imp.random_table(3, 4, s) for s in range(5)])
    rates = [0.0, 0.5, 0.75]
    c = pr.curves(loaded, batches, f, rates, "sst2", seed=2)
    gold = torch.tensor([label_map[e.label] for e in examples])

    def right(values, r):
        with torch.no_grad():
            return (logits_under(loaded, batches, pr.mask_at(values, r)).argmax(-1) == gold).numpy()

    for name, m in c["methods"].items():
        assert all(lo <= a <= hi for lo, a, hi in zip(m["accuracy_low"], m["accuracy"], m["accuracy_high"]))
    assert c["methods"]["random"]["seeds"] == 5
    tests = c["methods"]["attr"]["tests"]
    assert set(tests) == {"attention", "random"} and tests["attention"]["test"] == "mcnemar"
    for j, r in enumerate(rates):
        a, b = right(tables[0].values, r), right(tables[1].values, r)
        expected = stats.mcnemar(a, b, "greater")["p"]
        assert tests["attention"]["p"][j] == pytest.approx(expected)
        seeds = np.mean([right(imp.random_table(3, 4, s).values, r) for s in range(5)], axis=0)
        assert tests["random"]["difference"][j] == pytest.approx(a.mean() - seeds.mean())
    assert tests["attention"]["p_holm"] == pytest.approx(stats.holm(tests["attention"]["p"]))
    # at rate 0 nothing is masked: no discordant pair, p = 1
    assert tests["attention"]["p"][0] == 1.0
    again = pr.curves(loaded, batches, f, rates, "sst2", seed=2)
    assert again["methods"] == c["methods"]


def test_plots_draw_every_bootstrap_band():
    """Each curve with an interval gets its band (a filled area spanning low..high), and the
    effectiveness orders their bars; the titles say what is shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection, PolyCollection

    from attattr_cli.analysis import plots

    rates = [0.0, 0.5, 1.0]
    curves = {"metric": "accuracy", "rates": rates, "n_examples": 10, "baseline": {"accuracy": 0.9}, "level": 0.95,
              "methods": {m: {"method": m, "accuracy": [0.9, 0.7 + k / 10, 0.5],
                              "accuracy_low": [0.8, 0.6 + k / 10, 0.4], "accuracy_high": [1.0, 0.8 + k / 10, 0.6]}
                          for k, m in enumerate(("attr", "taylor", "attention"))}}
    fig, ax = plt.subplots()
    plots._curves_panel(ax, curves)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 3 and "bootstrap interval" in ax.get_title()
    ys = np.concatenate([b.get_paths()[0].vertices[:, 1] for b in bands])
    assert ys.min() == pytest.approx(0.4) and ys.max() == pytest.approx(1.0)
    plt.close(fig)

    eff = {"ks": [2, 4], "n_examples": 10, "baseline_accuracy": 0.9,
           "orders": {o: {"accuracy": [0.8, 0.7], "accuracy_low": [0.7, 0.6], "accuracy_high": [0.9, 0.8]}
                      for o in ("attr_small_first", "attr_large_first")}}
    fig, ax = plt.subplots()
    plots._effectiveness_panel(ax, eff)
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == 2 and "bootstrap interval" in ax.get_title()
    plt.close(fig)


@pytest.mark.parametrize("args,text", [
    ([], "nothing to do: give --importance (curves) and/or --effectiveness (a store)"),
    (["--importance", "imp.h5", "--keep-heads", "0.5"], "--keep-heads and --save-model go together"),
    (["--effectiveness", "s.h5", "--keep-heads", "0.5", "--save-model", "out"], "--keep-heads needs --importance to rank the heads"),
])
def test_cli_option_combinations_are_one_line_before_anything_is_read(tmp_path, args, text):
    from conftest import one_error_line, run_cli

    paths = [str(tmp_path / a) if a.endswith((".h5", "out")) else a for a in args]
    one_error_line(run_cli("prune", "--out", str(tmp_path / "curves.json"), *paths), text)
    assert not any(tmp_path.iterdir())
