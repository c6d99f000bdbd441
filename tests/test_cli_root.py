"""Root CLI conventions: exit codes in help, shell completion, help without type tags on flags,
plain progress lines when stderr is not a terminal, tree's --root/--example spellings, merge --json."""

from __future__ import annotations

import json
import re

import typer
from typer.testing import CliRunner

from attattr_cli import errors
from attattr_cli.cli import app, common
from attattr_cli.store import Store

from test_startup import small_store  # noqa: F401  (fixture)

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


def test_shell_completion_is_offered():
    result = runner.invoke(app, ["--help"])
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout
    shown = runner.invoke(app, ["--show-completion", "bash"])
    assert shown.exit_code == 0 and "complete" in shown.stdout


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


def test_tree_root_and_example_spellings(small_store):  # noqa: F811
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


def test_merge_json_summary(small_store, tmp_path):  # noqa: F811
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
