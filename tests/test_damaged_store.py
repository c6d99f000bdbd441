"""Readers validate what they read: a store whose convergence data (or another dataset an
analysis uses) is not what attattr wrote is refused in one line by every command that reads
it, as `info` refuses it, with no traceback (attattr_cli/store/reader.py, ``checked``)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from conftest import one_error_line, run_cli


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    out = tmp_path_factory.mktemp("damaged") / "s.h5"
    r = run_cli("score", "--out", out, "--examples", "0:2", "--tol", "0.5", "-q")
    assert r.exit_code == 0, r.output
    with h5py.File(out, "r") as f:
        assert "convergence" in f["examples/00000000"]  # the dataset the damage goes to
    return out


def _string_state(g):
    n = g["convergence"].shape[0]
    del g["convergence"]
    g.create_dataset("convergence", data=np.array(["converged"] * n, dtype=h5py.string_dtype()))


def _group_not_dataset(g):
    del g["convergence"]
    g.create_group("convergence")


def _tol_text(g):
    g["convergence"].attrs["tol"] = "abc"


def _tol_inf(g):
    g["convergence"].attrs["tol"] = np.inf


def _unknown_state(g):
    g["convergence"][0] = 77


def _residual_shape(g):
    del g["residual"]
    g.create_dataset("residual", data=np.zeros((2, 2), np.float32))


DAMAGE = {"a string where a state is": (_string_state, "'convergence' holds"),
          "a group where a dataset is": (_group_not_dataset, "'convergence' is a group"),
          "tol = 'abc'": (_tol_text, "tolerance is 'abc'"),
          "tol = inf": (_tol_inf, "tolerance is inf"),
          "an unknown state": (_unknown_state, "unknown states [77]"),
          "a residual of another shape": (_residual_shape, "'residual' has 2 dimensions")}

COMMANDS = {
    "info": lambda s, t: ["info", s],
    "view": lambda s, t: ["view", s, "-n", 0, "-o", t / "v.html"],
    "report": lambda s, t: ["report", s, "-o", t / "r.html"],
    "tree": lambda s, t: ["tree", s, "-n", 0, "-o", t / "t.json"],
    "importance": lambda s, t: ["importance", s, "--out", t / "i.h5", "-q"],
    "triggers": lambda s, t: ["triggers", s, "--out", t / "t.json", "-q"],
    "faithfulness": lambda s, t: ["faithfulness", s, "--out", t / "f.json", "--methods", "attr",
                                  "--permutations", 0, "-q"],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_damaged_store_is_one_line_in_every_reader(scored, tmp_path, damage, command):
    store = tmp_path / "s.h5"
    shutil.copyfile(scored, store)
    spoil, said = DAMAGE[damage]
    with h5py.File(store, "r+") as f:
        spoil(f["examples/00000000"])
    before = store.read_bytes()
    line = one_error_line(run_cli(*COMMANDS[command](store, tmp_path)), "is damaged", said)
    assert "example 0" in line
    assert store.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]  # nothing written
