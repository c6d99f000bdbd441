"""Edge values are refused before anything loads (one line, nothing written), and every JSON
attattr prints or writes is strict: no NaN or Infinity, which JSON.parse and other strict
readers refuse (attattr_cli/fileio.py, ``dumps``)."""

from __future__ import annotations

import json
import re
import shutil

import h5py
import pytest

from conftest import one_error_line, run_cli


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, as JSON.parse does."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("edge") / "s.h5"
    r = run_cli("score", "--out", out, "--examples", "0:2", "--steps", 2, "-q")
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("command", ["faithfulness", "importance", "prune"])
@pytest.mark.parametrize("methods", ["", " , "])
def test_empty_methods_are_refused(store, tmp_path, command, methods):
    out = tmp_path / ("o.h5" if command == "importance" else "o.json")
    args = {"faithfulness": [store], "importance": [store], "prune": ["--importance", store]}[command]
    one_error_line(run_cli(command, *args, "--out", out, "--methods", methods), "--methods is empty")
    assert not out.exists()


@pytest.mark.parametrize("command", ["score", "triggers", "faithfulness"])
@pytest.mark.parametrize("tol", ["inf", "-inf", "nan", "0", "-1"])
def test_tol_non_finite_or_not_positive_is_refused(tmp_path, command, tol):
    out = tmp_path / ("o.h5" if command == "score" else "o.json")
    one_error_line(run_cli(command, "--out", out, "--tol", tol, "--examples", "0:1"),
                   "--tol must be a finite number > 0")
    assert not any(tmp_path.iterdir())


def test_printed_and_written_json_is_strict_for_an_old_store_with_infinity(store, tmp_path):
    """A store whose recorded options hold Infinity (written before --tol inf was refused):
    info --json, the report page's data and the importance --json rows stay strict JSON."""
    old = tmp_path / "old.h5"
    shutil.copyfile(store, old)
    with h5py.File(old, "r+") as f:
        opts = json.loads(f["provenance"].attrs["options"])
        f["provenance"].attrs["options"] = json.dumps(dict(opts, tol=float("inf"), max_nodes=float("nan")))
    info = run_cli("info", old, "--json")
    assert info.exit_code == 0, info.output
    doc = _strict(info.stdout)
    assert doc["provenance"]["options"]["tol"] is None
    report = tmp_path / "r.html"
    r = run_cli("report", old, "-o", report)
    assert r.exit_code == 0, r.output
    page = report.read_text()
    assert not re.search(r"\b(NaN|-?Infinity)\b", " ".join(re.findall(r"<script[^>]*json[^>]*>(.*?)</script>", page,
                                                                          re.S)))
    rows = run_cli("importance", old, "--out", tmp_path / "i.h5", "--methods", "attr", "--json", "-q")
    assert rows.exit_code == 0, rows.output
    _strict(rows.stdout)
