"""The one registry class every method family uses (attattr_cli/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from attattr_cli.errors import OptionError
from attattr_cli.registry import Registry


@dataclass(frozen=True)
class Entry:
    name: str


def test_register_parse_and_refuse():
    reg = Registry("widget method")
    a, b = reg.register(Entry("a")), reg.register(Entry("b"))
    assert list(reg) == ["a", "b"] and reg["a"] is a and "b" in reg and len(reg) == 2 and reg.names() == ("a", "b")
    for bad in ("a", "all"):
        with pytest.raises(ValueError, match="widget method '.*' is registered twice"):
            reg.register(Entry(bad))
    assert reg.parse(None, ("b",)) == ("b",)
    assert reg.parse("all", ()) == ("a", "b")
    assert reg.parse("b, a,b", (), first="a") == ("a", "b")
    with pytest.raises(OptionError, match="unknown widget method 'c'; available: a, b"):
        reg.parse("a,c", ())
    with pytest.raises(OptionError, match="methods is empty"):
        reg.parse(" , ", ())
    assert b is reg.get("b") and reg.get("z") is None


def test_both_method_families_are_registries():
    from attattr_cli.analysis import circuits, methods

    assert isinstance(circuits.REGISTRY, Registry) and isinstance(methods.REGISTRY, Registry)
    assert circuits.register == circuits.REGISTRY.register and methods.register == methods.REGISTRY.register
    assert circuits.REGISTRY.what == "head method" and methods.REGISTRY.what == "token importance method"


def test_source_methods_are_a_registry_and_the_cli_names_them():
    import importlib

    from attattr_cli.analysis import context_check

    assert isinstance(context_check.SOURCE_METHODS, Registry)
    assert context_check.METHODS == context_check.SOURCE_METHODS.names() == ("attattr", "attention",
                                                                             "input_x_gradient", "loo")
    cli = importlib.import_module("attattr_cli.cli.sources_check")
    assert cli.METHODS_HELP == ", ".join(context_check.METHODS)


def _plugin_from_docs() -> str:
    """The plugin module of docs/extending.md, as written there."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    after = doc.split("<!-- the plugin of tests/test_registry.py: my_methods.py -->", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


PLUGIN_RUN = r'''
import json, sys
from typer.testing import CliRunner
from attattr_cli.cli import app

model, pairs, out = sys.argv[1:4]
run = lambda *a: CliRunner().invoke(app, [str(x) for x in a])
r = run("methods", "--json")
listed = json.loads(r.stdout)
r_circuit = run("circuit", "--model", model, "--data", pairs, "--methods", "gates-midpoint,attr-gates", "--split",
                "none", "--bootstrap", "10", "--json", out + "/c.json", "-q")
r_imp = run("importance", "--model", model, "--data", pairs, "--methods", "gates-midpoint", "--out", out + "/imp.h5", "-q")
r_prune = run("prune", "--model", model, "--data", pairs, "--importance", out + "/imp.h5", "--rates", "0,0.5,1",
              "--split", "none", "--out", out + "/curves.json", "-q")
print(json.dumps({"listed": listed, "warned": r.stderr, "codes": [r.exit_code, r_circuit.exit_code, r_imp.exit_code, r_prune.exit_code],
                  "outputs": [r_circuit.output, r_imp.output, r_prune.output]}))
'''


def test_a_plugin_method_from_an_entry_point_appears_in_every_command_it_fits(tmp_path, llama_dir):
    """docs/extending.md's one-file head method, installed as an ``attattr.methods`` entry point
    (a dist-info on the path, as pip leaves it), is listed by `attattr methods`, run by
    `circuit`, made a table by `importance` on pairs and judged by `prune`; a second entry point
    that fails to load is reported in one line and left out."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from attattr_cli.data.pairs import write_pairs
    from test_circuits import _pairs

    site = tmp_path / "site"
    (site / "my_methods-0.1.dist-info").mkdir(parents=True)
    (site / "my_methods.py").write_text(_plugin_from_docs())
    (site / "broken_methods.py").write_text("raise ImportError('no such thing')\n")
    (site / "my_methods-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: my-methods\nVersion: 0.1\n")
    (site / "my_methods-0.1.dist-info" / "entry_points.txt").write_text(
        "[attattr.methods]\ngates-midpoint = my_methods\nbroken = broken_methods\n")
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs, _pairs())
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", PLUGIN_RUN, str(llama_dir), str(pairs), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["codes"] == [0, 0, 0, 0], got["outputs"]
    row = [r for r in got["listed"]["methods"] if r["method"] == "gates-midpoint"]
    assert [(r["command"], r["units"], r["cost"]) for r in row] == [
        ("circuit", "heads", "1 counterfactual forward + 1 forward and backward")]
    assert got["listed"]["plugins"] == ["gates-midpoint"] and got["listed"]["failed"] == ["broken"]
    warned = [line for line in (got["warned"] + p.stderr).splitlines() if "'broken'" in line]
    assert len(warned) == 1 and "failed to load and is left out" in warned[0]
    circuit = json.loads((tmp_path / "c.json").read_text())
    # scores: one [layer, head, score] row per head (2 layers x 4 heads)
    mid, ig = (np.asarray(circuit["methods"][m]["scores"], dtype=float)[:, -1] for m in ("gates-midpoint", "attr-gates"))
    assert mid.shape == ig.shape == (8,) and np.isfinite(mid).all() and np.abs(mid).max() > 0
    # the midpoint is one node of attr-gates' integral: close to the four-node value, not equal
    assert np.corrcoef(mid.ravel(), ig.ravel())[0, 1] > 0.9 and not np.allclose(mid, ig)
    import h5py

    with h5py.File(tmp_path / "imp.h5") as f:
        assert f["methods/gates-midpoint"].shape == (2, 4)
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert "gates-midpoint" in curves["curves"]["methods"]


def test_every_family_is_listed_with_units_cost_and_command():
    import attattr_cli as aa

    found = aa.methods()
    commands = {r["command"] for r in found.rows}
    assert commands == {"circuit", "importance", "faithfulness", "sources-check", "demo data", "score --task",
                        "circuit --ablation"}
    assert all(r["units"] and r["description"] for r in found.rows)
    assert set(found.names("sources-check")) == {"attattr", "attention", "input_x_gradient", "loo"}
    assert found.names("importance") == ["attr", "taylor", "attention", "random"]
    with pytest.raises(OptionError, match="unknown command 'prune'"):
        aa.methods("prune")


def test_importance_lists_exactly_the_methods_that_fit_the_task():
    from attattr_cli.analysis import circuits, importance as imp

    assert imp.methods_for("store") == ("attr", "attention", "random")
    assert imp.methods_for("data") == ("taylor", "random")
    on_pairs = imp.methods_for("pairs")
    # on pairs: taylor and the seeded random tables, then every circuit head method but circuit's own random
    assert on_pairs[:2] == ("taylor", "random") and "atp" in on_pairs and "nap-ig" in on_pairs
    assert on_pairs.count("random") == 1 and set(on_pairs[2:]) == set(circuits.NAMES) - {"random"}
    assert imp.parse_methods("all", "data") == ["taylor", "random"]
    with pytest.raises(OptionError, match="method 'atp' needs clean / counterfactual pairs"):
        imp.parse_methods("atp", "store")


def test_pair_tasks_are_a_registry_one_module_each():
    import importlib

    from attattr_cli.api.demo import PAIR_TASKS, pair_tasks
    from attattr_cli.data import pairs

    assert isinstance(pairs.PAIR_TASKS, Registry) and pair_tasks() == PAIR_TASKS == pairs.PAIR_TASKS.names()
    for name in PAIR_TASKS:  # each task is the module of its name, and registers itself there
        module = importlib.import_module("attattr_cli.data.pair_tasks." + name.replace("-", "_"))
        assert pairs.PAIR_TASKS[name].generate.__module__ == module.__name__


def test_the_command_line_starts_without_loading_plugins():
    """`attattr --help` stays quick: importing the CLI reads no entry points (a run does)."""
    import subprocess
    import sys

    code = "import attattr_cli.cli; from attattr_cli import registry; print(registry._plugins['state'])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "not loaded"


def test_an_ablation_is_one_registered_entry_and_circuit_runs_a_new_one(tokenizer):
    """A new ablation (here: every removed head's output doubled towards minus its own, i.e.
    the clean output negated) registered as an entry is accepted by circuit like the built-in
    ones; unregistered names are refused in one line listing the registered ones."""
    import torch

    import attattr_cli as aa
    from attattr_cli.analysis.circuits.ablations import ABLATIONS, Ablation
    from attattr_cli.models.loading import prepare
    from conftest import build_model
    from test_circuits import _pairs

    assert ABLATIONS.names() == ("patching", "mean", "zero")
    negate = Ablation("negate", "minus the clean output", lambda task, batch, shared: {
        k: -v for k, v in task.record(batch.clean)[1].items()})
    ABLATIONS.register(negate)
    try:
        loaded = prepare(build_model("llama", torch.float64, num_labels=2, layers=2, lm=True), tokenizer, "tiny-llama",
                         lm=True)
        zero = aa.circuit(loaded, _pairs(), methods="atp", ablation="zero", split="none", bootstrap=10)
        neg = aa.circuit(loaded, _pairs(), methods="atp", ablation="negate", split="none", bootstrap=10)
        assert neg.clean == pytest.approx(zero.clean) and neg.empty != pytest.approx(zero.empty)
    finally:
        ABLATIONS._entries.pop("negate")
    with pytest.raises(OptionError, match="unknown ablation 'negate'"):
        aa.circuit(loaded, _pairs(), methods="atp", ablation="negate")
