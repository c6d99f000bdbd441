"""The root of the CLI: store-only commands start without torch or transformers (so shell
pipelines stay quick), exit codes in help, shell completion, help without type tags on flags,
plain progress lines when stderr is not a terminal, tree's --root/--example, merge --json;
``score`` imports nothing it does not use, and docs/cli.md's option table is ``score``'s.

Startup: each command runs in a fresh interpreter that imports the CLI and runs it, then
reports which heavy modules were imported; the store is written by hand, without a model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from attattr_cli import errors
from attattr_cli.cli import app, common
from attattr_cli.store import Store, StoreWriter

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers")
# what scoring needs none of (pictures, tables, other attribution libraries, graphs): ``score``
# pays torch and transformers' model code only
NOT_FOR_SCORING = ("matplotlib", "pandas", "captum", "networkx", "IPython")

# runs the app as `attattr ARGS...` and prints, as the last line on stderr, the exit code and
# which of HEAVY were imported
RUNNER = """
import json, sys
sys.argv = ["attattr", *json.loads(sys.argv[1])]
from attattr_cli.cli import app
try:
    app()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules],
                  "not_for_scoring": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""" % (HEAVY, NOT_FOR_SCORING)


def _run(*args, cwd) -> tuple[dict, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps([str(a) for a in args])], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report, result


def _example(index: int, rng: np.random.Generator, layers: int = 2, heads: int = 2):
    tokens = ["[CLS]", "a", "good", "film", "[SEP]"]
    n = len(tokens)
    attribution = rng.random((layers, heads, n, n)).astype(np.float32)
    return SimpleNamespace(
        index=index, tokens=tokens, input_ids=np.arange(n), segment_ids=np.zeros(n, np.int64),
        logits=np.array([0.2, -0.1]), probs=np.array([0.57, 0.43]), layers=list(range(layers)),
        attribution=attribution, attention=rng.random((layers, heads, n, n)).astype(np.float32),
        head_max=attribution.max(axis=(2, 3)), f_baseline=np.full(layers, 0.5), residual=np.full(layers, 1e-4),
        gold=index % 2, pred=0, target=0, f_full=0.57, kernel="torch", truncated=False,
        text_a="a good film", text_b=None, meta={},
    )


@pytest.fixture
def small_store(tmp_path) -> Path:
    """Two examples of a 2-layer, 2-head model, written without any model."""
    path = tmp_path / "small.h5"
    rng = np.random.default_rng(0)
    fingerprint = {"weights_sha256": "0" * 64, "data": "hand.tsv", "data_sha256": "1" * 64, "options": {"steps": 4}}
    provenance = {"model": "hand-made", "num_layers": 2, "num_heads": 2, "label_names": ["negative", "positive"]}
    with StoreWriter(path, fingerprint, provenance) as w:
        for i in range(2):
            w.write(_example(i, rng))
    return path


@pytest.mark.parametrize("args", [
    ["--help"],
    ["--version"],
    ["info", "{store}"],
    ["info", "{store}", "--json"],
    ["tree", "{store}", "--example", "1", "--format", "json", "-q"],
    ["merge", "{store}", "--out", "{dir}/merged.h5", "--json"],
    ["triggers", "{store}", "--out", "{dir}/triggers.json"],
], ids=["help", "version", "info", "info-json", "tree", "merge", "triggers"])
def test_store_only_commands_import_neither_torch_nor_transformers(small_store, tmp_path, args):
    args = [a.format(store=small_store, dir=tmp_path) for a in args]
    report, result = _run(*args, cwd=tmp_path)
    assert report["code"] == 0, result.stderr
    assert report["heavy"] == [], f"attattr {' '.join(args)} imported {report['heavy']}"
    assert result.stdout.strip()  # each of them prints something on stdout
    if args[0] == "info" and "--json" in args:
        assert json.loads(result.stdout)["examples"] == 2
    if args[0] == "merge":
        with Store(tmp_path / "merged.h5") as s:
            assert s.indices() == [0, 1]


def test_score_imports_nothing_it_does_not_use(tmp_path):
    """Every ``score`` pays for its imports (about 5 s of CPU: torch and transformers' model
    code); nothing for pictures, tables or other methods is added to that."""
    report, result = _run("score", "--examples", "0", "--steps", "2", "--out", tmp_path / "s.h5", "-q", cwd=tmp_path)
    assert report["code"] == 0, result.stderr
    assert report["heavy"] == ["torch", "transformers"]
    assert report["not_for_scoring"] == [], f"attattr score imported {report['not_for_scoring']}"


def test_the_option_table_of_docs_cli_is_scores_options():
    """docs/cli.md's table of ``score`` options names every option ``score`` has, and no other."""
    from typer.main import get_command

    table = [line for line in (REPO / "docs" / "cli.md").read_text().splitlines() if line.startswith("| `-")]
    named = {flag for line in table for flag in re.findall(r"`(--[a-z][a-z-]*)", line.split(" | ")[0])}
    params = get_command(app).commands["score"].params
    options = {o for p in params if not getattr(p, "hidden", False) for o in p.opts if o.startswith("--")}
    assert named == options, (sorted(options - named), sorted(named - options))


def test_help_constants_agree_with_the_library():
    """The token importance methods named in help are written out in the command module
    (importing the library's would import torch); they must match it. The quadrature rules
    are the library's own, read from torch-free engine/options.py."""
    import importlib

    from attattr_cli.analysis.token_importance import METHODS
    from attattr_cli.engine.integrate import RULES

    # (attattr_cli.cli.score is the command function; the module is reached by its full name)
    assert importlib.import_module("attattr_cli.cli.score").RULES == RULES
    assert importlib.import_module("attattr_cli.cli.faithfulness").METHODS == tuple(METHODS)


# -- root conventions ---------------------------------------------------------------------

runner = CliRunner()


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_exit_code_is_listed_in_help():
    codes = {errors.AttattrError.exit_code} | {c.exit_code for c in _subclasses(errors.AttattrError)}
    assert codes <= set(common.EXIT_CODES)
    assert {0, 130} <= set(common.EXIT_CODES)
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "Exit codes:" in text
    for code, what in common.EXIT_CODES.items():
        assert f"{code} {what}" in text


def test_shell_completion_is_offered(monkeypatch):
    result = runner.invoke(app, ["--help"])
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout
    # Typer detects the running shell unless told not to; where it cannot (no shell among the
    # parent processes), `--show-completion` takes the shell's name instead
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    shown = runner.invoke(app, ["--show-completion", "bash"])
    assert shown.exit_code == 0 and "complete" in shown.stdout, (shown.output, shown.exception)


def test_help_shows_no_type_tag_beside_flags():
    commands = [[]] + [[name] for name in ("score", "info", "merge", "tree", "import-json", "finetune", "importance",
                                           "prune", "triggers", "attack", "faithfulness")] + [["demo", "train"]]
    for cmd in commands:
        result = runner.invoke(app, [*cmd, "--help"])
        assert result.exit_code == 0, cmd
        assert "<bool>" not in result.stdout, cmd
    tree_help = runner.invoke(app, ["tree", "--help"]).stdout
    assert re.search(r"--tau\s+<float>", tree_help)  # options that take a value keep their type


def _progress_app(steps: int, total: int):
    demo = typer.Typer()

    @demo.command()
    def work():
        with common.progress_bar("work") as bar:
            for i in range(1, steps + 1):
                bar(i, total, f"item {i}")

    return demo


def test_progress_off_a_terminal_is_plain_lines(monkeypatch):
    # CliRunner's stderr is not a terminal; a line at every update when the interval is 0
    monkeypatch.setattr(common, "PLAIN_EVERY", 0.0)
    result = runner.invoke(_progress_app(4, 4), [])
    assert result.exit_code == 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("work: 1/4 (25%), ") and lines[0].endswith("item 1")
    assert lines[-1].startswith("work: 4/4 (100%), ") and "ETA" not in lines[-1]
    assert all(re.search(r"\d/s|elapsed", line) for line in lines)
    assert any("ETA" in line for line in lines[1:-1])
    assert not any("\x1b" in line or "\r" in line for line in lines)  # no terminal control codes

    # with the default interval a quick run says nothing until its end, then one line
    monkeypatch.setattr(common, "PLAIN_EVERY", 3600.0)
    result = runner.invoke(_progress_app(50, 100), [])
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("work: 50/100 (50%)")


def test_tree_root_and_example_spellings(small_store):
    base = runner.invoke(app, ["tree", str(small_store), "--example", "1", "--format", "json", "-q"])
    assert base.exit_code == 0, base.output
    for args in (["-n", "1"], ["-e", "1"]):
        again = runner.invoke(app, ["tree", str(small_store), *args, "--format", "json", "-q"])
        assert again.exit_code == 0 and again.stdout == base.stdout
    rooted = runner.invoke(app, ["tree", str(small_store), "-n", "1", "--root", "2", "--format", "json", "-q"])
    old = runner.invoke(app, ["tree", str(small_store), "-n", "1", "--top", "2", "--format", "json", "-q"])
    assert rooted.exit_code == 0 and json.loads(rooted.stdout)["top"] == 2 and old.stdout == rooted.stdout
    missing = runner.invoke(app, ["tree", str(small_store)])
    assert missing.exit_code == 2 and missing.stderr.strip() == "Error: give the example to draw: --example N (-n N)"
    both = runner.invoke(app, ["tree", str(small_store), "-n", "1", "--root", "2", "--top", "3"])
    assert both.exit_code == 2 and "--root" in both.stderr


def test_merge_json_summary(small_store, tmp_path):
    out = tmp_path / "m.h5"
    result = runner.invoke(app, ["merge", str(small_store), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["out"] == str(out) and summary["added"] == 2 and summary["skipped"] == 0
    assert summary["shards"] == [{"file": small_store.name, "shard": "", "examples": 2, "added": 2}]
    assert summary["notes"] == [] and summary["problems"] == []
    again = json.loads(runner.invoke(app, ["merge", str(small_store), "--out", str(out), "--json", "-q"]).stdout)
    assert (again["added"], again["skipped"]) == (0, 2)
    with Store(out) as s:
        assert s.indices() == [0, 1] and s.num_layers() == 2
