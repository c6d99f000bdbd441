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


# -- a generation's steps (schema 1.4): a step missing or damaged is one line, never a shorter generation
@pytest.fixture(scope="module")
def generation(tmp_path_factory, tokenizer):
    import torch

    from conftest import build_model

    folder = tmp_path_factory.mktemp("gen")
    build_model("llama", torch.float32, num_labels=2, layers=2, lm=True).save_pretrained(folder / "lm")
    tokenizer.save_pretrained(folder / "lm")
    out = folder / "g.h5"
    r = run_cli("score", "--lm", "--model", folder / "lm", "--prompt", "w1 w2 w3", "--generate", 3, "--steps", 2,
                "-q", "--out", out)
    assert r.exit_code == 0, r.output
    return out


def _step_deleted(g):
    del g["steps/00001"]


def _step_added(g):
    g["steps"].create_group("00007")


def _step_map_cut(g):
    a = g["steps/00001/attribution"][()]
    del g["steps/00001/attribution"]
    g["steps/00001"].create_dataset("attribution", data=a[:, :, :2, :2])


def _step_strings(g):
    del g["steps/00001/residual"]
    g["steps/00001"].create_dataset("residual", data=np.array(["x", "y"], dtype=h5py.string_dtype()))


def _step_attribute(g):
    g["steps/00001"].attrs["n_tokens"] = "many"


STEP_DAMAGE = {"a step deleted": (_step_deleted, "its generation has 3 steps, but step 1 is missing"),
               "a step added": (_step_added, "'steps' holds 00007 besides them"),
               "a step's map cut": (_step_map_cut, "step 1, 'attribution' has the shape (2, 4, 2, 2)"),
               "a step's residual as text": (_step_strings, "step 1, 'residual' holds object values"),
               "a step's attribute as text": (_step_attribute, "step 1, its attribute 'n_tokens' is 'many'")}

STEP_COMMANDS = {
    "info": lambda s, t: ["info", s],
    "view": lambda s, t: ["view", s, "-n", 0, "-o", t / "v.html"],
    "report": lambda s, t: ["report", s, "-o", t / "r.html"],
    "tree": lambda s, t: ["tree", s, "-n", 0, "--step", 0, "-o", t / "t.json"],
}


@pytest.mark.parametrize("damage", list(STEP_DAMAGE))
@pytest.mark.parametrize("command", list(STEP_COMMANDS))
def test_a_damaged_generation_is_one_line_in_every_reader(generation, tmp_path, damage, command):
    store = tmp_path / "s.h5"
    shutil.copyfile(generation, store)
    spoil, said = STEP_DAMAGE[damage]
    with h5py.File(store, "r+") as f:
        spoil(f["examples/00000000"])
    before = store.read_bytes()
    line = one_error_line(run_cli(*STEP_COMMANDS[command](store, tmp_path)), "is damaged", "example 0", said)
    assert line
    assert store.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]  # nothing written


def test_an_intact_generation_reads_every_step(generation):
    from attattr_cli.store import Store

    with Store(generation) as s:
        assert [st.meta["step"]["step"] for st in s.get(0).steps] == [0, 1, 2]
