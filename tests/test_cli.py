"""The command line: help everywhere, README coverage, pipelines, one-line errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from attattr_cli.cli import app
from attattr_cli.store import Store
from conftest import one_error_line, run_cli

ROOT = Path(__file__).resolve().parents[1]


def _commands(group=app, prefix=()):
    import typer.main

    cmd = typer.main.get_command(group)
    out = []

    def walk(c, path):
        subs = getattr(c, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + (name,))
        else:
            out.append(path)

    walk(cmd, prefix)
    return out


def test_every_command_has_help_and_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    commands = _commands()
    assert ("score",) in commands and ("info",) in commands
    for path in commands:
        result = run_cli(*path, "--help")
        assert result.exit_code == 0, path
        assert len(result.output.strip().splitlines()) > 3
        assert f"attattr {' '.join(path)}" in readme, f"README lacks 'attattr {' '.join(path)}'"


def test_score_on_builtin_default_and_info(tmp_path):
    out = tmp_path / "s.h5"
    result = run_cli("score", "--out", out, "--examples", "0:3", "--steps", "4")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    assert "scored 3 examples (0 already in the store)" in result.stderr
    with Store(out) as s:
        assert s.indices() == [0, 1, 2]
        prov = s.provenance
        assert prov["task"] == "synthetic" and prov["model_type"] == "bert"
        e = s.get(0)
        assert e.meta["pair"] and e.text_b
    again = run_cli("score", "--out", out, "--examples", "0:4", "--steps", "4")
    assert again.exit_code == 0 and "scored 1 example (3 already in the store)" in again.stderr
    info = run_cli("info", out)
    assert info.exit_code == 0
    assert "synthetic" in info.stdout and "examples" in info.stdout and "4 (indices 0..3)" in info.stdout
    js = run_cli("info", out, "--json")
    assert '"examples": 4' in js.stdout


def test_errors_are_one_line(tmp_path, tiny_model_dir, sst2_small):
    out = tmp_path / "s.h5"
    one_error_line(run_cli("score", "--out", out, "--data", tmp_path / "missing.tsv", "--model", tiny_model_dir,
                           "--task", "sst2"), "missing.tsv: no such file")
    wrong = tmp_path / "wrong.tsv"
    wrong.write_text("text_x\tlabel\nw1\t0\n")
    one_error_line(run_cli("score", "--out", out, "--data", wrong, "--model", tiny_model_dir, "--task", "sst2"),
                   "task 'sst2' expects columns sentence")
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\nw1 w2\tmaybe\n")
    one_error_line(run_cli("score", "--out", out, "--data", bad, "--model", tiny_model_dir, "--task", "sst2"),
                   "unknown label 'maybe'")
    one_error_line(run_cli("score", "--out", out, "--task", "mnli"), "no local data for task 'mnli'")
    one_error_line(run_cli("score", "--out", out, "--model", tmp_path / "nomodel", "--data", sst2_small),
                   "no such folder")
    one_error_line(run_cli("score", "--out", out, "--task", "cola"), "unknown task 'cola'")
    one_error_line(run_cli("score", "--out", out, "--examples", "0:3", "--layers", "9"), "layer 9 does not exist")
    one_error_line(run_cli("score", "--out", out, "--examples", "5000"), "example 5000 is out of range")
    one_error_line(run_cli("score", "--out", out, "--kernel", "triton"), "triton")
    one_error_line(run_cli("info", tmp_path / "nothing.h5"), "no such store")
    assert not out.exists()


def test_store_from_another_model_is_refused_untouched(tmp_path, tiny_model_dir, other_model_dir, sst2_small):
    out = tmp_path / "s.h5"
    ok = run_cli("score", "--out", out, "--model", tiny_model_dir, "--data", sst2_small, "--task", "sst2",
                 "--examples", "0:2", "--steps", "3", "-q")
    assert ok.exit_code == 0, ok.output
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    result = run_cli("score", "--out", out, "--model", other_model_dir, "--data", sst2_small, "--task", "sst2",
                     "--examples", "0:4", "--steps", "3", "-q")
    one_error_line(result, "was made with another model")
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest


def test_corrupt_store_is_refused_untouched(tmp_path):
    out = tmp_path / "s.h5"
    out.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)
    before = out.read_bytes()
    one_error_line(run_cli("score", "--out", out, "--examples", "0:1", "-q"), "s.h5")
    one_error_line(run_cli("info", out), "not a readable HDF5 store")
    assert out.read_bytes() == before


def test_demo_data_and_merge(tmp_path):
    data = tmp_path / "syn.tsv"
    r = run_cli("demo", "data", "--out", data, "--count", "5")
    assert r.exit_code == 0 and data.exists()
    again = run_cli("demo", "data", "--out", data)
    one_error_line(again, "exists; it was left as it is")
    a, b, m = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "m.h5"
    assert run_cli("score", "-o", a, "-e", "0", "--steps", "2", "-q").exit_code == 0
    assert run_cli("score", "-o", b, "-e", "1", "--steps", "2", "-q").exit_code == 0
    r = run_cli("merge", a, b, "--out", m)
    assert r.exit_code == 0 and r.stdout.strip() == str(m)
    with Store(m) as s:
        assert s.indices() == [0, 1]


def test_module_entry_point():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "attattr_cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("attattr ")
