"""NaN and inf: a float16 model whose logits overflow is flagged per example in the store;
`info` lists the flagged examples; every analysis that reads stores skips them and says how
many (docs/store.md, "Non-finite scores")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from attattr_cli.analysis import importance as imp
from attattr_cli.analysis.triggers import patterns_from_store
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.run import ScoreRequest, score_to_store
from attattr_cli.store import Store
from attattr_cli.store.schema import EXAMPLES

from conftest import WORDS, build_model, save_sentiment_model

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def _sentences() -> list[str]:
    return [" ".join(WORDS[i:i + 3 + i % 4]) for i in range(10)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "d.tsv"
    p.write_text("\n".join(["sentence\tlabel"] + [f"{t}\t{i % 2}" for i, t in enumerate(_sentences())]) + "\n")
    return p


@pytest.fixture(scope="module")
def overflowing_model(tmp_path_factory, tokenizer):
    """A tiny BERT whose logit of class 1 passes float16's largest value (65504) on about half
    the inputs: that logit reads one pooled unit, so that the inputs where the unit is above
    its median overflow. Class 0's logit stays finite (scored with --target 0 --logit, the
    other inputs' numbers are all finite)."""
    d = tmp_path_factory.mktemp("overflow")
    model = build_model("bert", num_labels=2)
    enc = tokenizer(_sentences(), padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = model.bert(**enc).pooler_output  # [example, unit], tanh: in (-1, 1)
        medians = pooled.median(0).values
        j = int(medians.argmax())
        t = float(medians[j])
        assert t > 0.1
        # logit 1 = 60000 + w * pooled[j]: past 65504 exactly where pooled[j] > t (weights finite in float16)
        model.classifier.weight[1].zero_()
        model.classifier.bias.zero_()
        model.classifier.weight[1, j] = 5504 / t
        model.classifier.bias[1] = 60000
    return save_sentiment_model(model, tokenizer, d)


@pytest.fixture(scope="module")
def store(tmp_path_factory, overflowing_model, data):
    out = tmp_path_factory.mktemp("store") / "s.h5"
    proc = subprocess.run([sys.executable, "-m", "attattr_cli", "score", "--model", str(overflowing_model),
                           "--data", str(data), "--task", "sst2", "--dtype", "float16", "--steps", "3",
                           "--target", "0", "--logit",
                           "--device", "cpu", "--out", str(out)], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def _really_nonfinite(path) -> dict[int, bool]:
    """Per example: does any stored number of it hold NaN or inf (the slow check)."""
    out = {}
    with h5py.File(path, "r") as f:
        for name, g in f[EXAMPLES].items():
            bad = False
            g.visititems(lambda _n, o: None)
            for key in ("logits", "probs", "attribution", "head_max", "f_baseline", "residual", "attention"):
                if key in g:
                    bad |= not np.isfinite(g[key][()]).all()
            bad |= not np.isfinite(float(g.attrs["f_full"]))
            out[int(name)] = bad
    return out


def test_overflow_is_flagged_where_it_arises(store):
    path, proc = store
    truth = _really_nonfinite(path)
    flagged_truth = sorted(i for i, bad in truth.items() if bad)
    assert 0 < len(flagged_truth) < len(truth), "the model should overflow on some inputs only"
    with Store(path) as s:
        assert s.flagged() == flagged_truth
        assert s.indices(finite=True) == sorted(i for i, bad in truth.items() if not bad)
        for i in flagged_truth:
            e = s.get(i)
            assert e.nonfinite
            assert (e.pred == -1) == ("logits" in e.nonfinite)  # no class predicted from inf/NaN logits
        for i in s.indices(finite=True):
            assert s.get(i).nonfinite == []
    warnings = [line for line in proc.stderr.splitlines() if "NaN or infinite" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"Warning: {len(flagged_truth)} example")


def test_info_reports_flagged_examples(store):
    path, _ = store
    proc = subprocess.run([sys.executable, "-m", "attattr_cli", "info", str(path), "--json"], capture_output=True,
                          text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    with Store(path) as s:
        assert summary["nonfinite_examples"] == s.flagged()
    assert summary["accuracy"] is None or np.isfinite(summary["accuracy"])
    assert all(np.isfinite(summary["mean_abs_residual_per_layer"]))


def test_analyses_skip_flagged_examples_and_count_them(store):
    path, _ = store
    with Store(path) as s:
        flagged, finite = s.flagged(), s.indices(finite=True)
        _, tables = imp.from_store(s, ["attr"])
        expected = np.mean([s.get(i).head_max for i in finite], axis=0)  # the average, by hand
        assert tables[0].skipped_nonfinite == len(flagged)
        np.testing.assert_allclose(tables[0].values, expected, rtol=1e-6)
        assert tables[0].examples == finite
        counts = {}
        patterns = patterns_from_store(s, counts=counts)
        assert counts["skipped_nonfinite"] == len(flagged)
        assert {p.example for p in patterns} <= set(finite)
    proc = subprocess.run([sys.executable, "-m", "attattr_cli", "importance", str(path), "--methods", "attr",
                           "--out", str(path.with_name("imp.h5"))], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("skipped ")] == [
        f"skipped {len(flagged)} example{'s' if len(flagged) != 1 else ''} flagged 'nonfinite' in the store"
        f" (NaN or inf in {'their' if len(flagged) != 1 else 'its'} scores)"]
    tree = subprocess.run([sys.executable, "-m", "attattr_cli", "tree", str(path), "--example", str(flagged[0]),
                           "-o", str(path.with_name("t.json"))], capture_output=True, text=True, env=ENV, timeout=300)
    assert tree.returncode == 4 and "Traceback" not in tree.stderr
    assert "NaN or inf" in tree.stderr and not path.with_name("t.json").exists()


def test_faithfulness_skips_flagged_examples(store, overflowing_model, tmp_path):
    path, _ = store
    copy = tmp_path / "s.h5"
    copy.write_bytes(path.read_bytes())
    with Store(copy) as s:
        flagged, finite = s.flagged(), s.indices(finite=True)
    report = tmp_path / "f.json"
    proc = subprocess.run([sys.executable, "-m", "attattr_cli", "faithfulness", str(copy), "--out", str(report),
                           "--model", str(overflowing_model), "--methods", "attention_mean,random", "--permutations", "0",
                           "--device", "cpu", "-q"], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(report.read_text())
    assert doc["skipped_nonfinite"] == len(flagged) and doc["examples"] == len(finite)
    assert sorted(r["index"] for r in doc["per_example"]) == finite
    assert sum(line.startswith("skipped ") for line in proc.stderr.splitlines()) == 1


def test_prune_effectiveness_skips_flagged_examples(store, overflowing_model, data):
    """The store was scored in float16, so the model is loaded so (the CLI's prune loads
    float32 and would refuse the store as made by other weights)."""
    from attattr_cli.analysis.prune import effectiveness_from_store
    from attattr_cli.engine.run import resolve_inputs
    from attattr_cli.models.loading import align_labels, load

    path, _ = store
    with Store(path) as s:
        flagged, finite = s.flagged(), s.indices(finite=True)
    loaded = load(str(overflowing_model), device="cpu", dtype="float16")
    _, task, examples, labels = resolve_inputs(str(overflowing_model), str(data), "sst2")
    label_map, _ = align_labels(labels, loaded)
    e = effectiveness_from_store(loaded, path, examples, examples, label_map, ks=[2])
    assert e["skipped_nonfinite"] == len(flagged) and e["n_examples"] == len(finite)
