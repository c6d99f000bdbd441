"""`attattr circuit` / `aa.circuit` cannot hurt its data (issue 52): every bad input is one line
before the model loads, an output never lands on an input, a device or a folder, one run at a
time writes an output, a metric gap within noise is refused, and Ctrl-C says what it leaves."""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np
import pytest
import torch

from conftest import one_error_line, run_cli
from test_circuits import _pairs, loaded  # noqa: F401 (loaded: the tiny causal LM fixture)


@pytest.fixture
def pairs_file(tmp_path):
    from attattr_cli.data.pairs import write_pairs

    path = tmp_path / "pairs.jsonl"
    write_pairs(path, _pairs())
    return path


@pytest.fixture
def no_load(monkeypatch):
    """The model must not load: loading it fails the test."""
    import attattr_cli.api.circuits as api

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(api, "using", refuse)


def _refused(call, error, *needles):
    with pytest.raises(error) as exc:
        call()
    text = str(exc.value)
    assert "\n" not in text, text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


# ----------------------------------------------------------------------------- 1. outputs onto inputs


def test_api_refuses_an_output_onto_the_pairs_file_a_device_or_a_folder(pairs_file, tmp_path, no_load):
    import attattr_cli as aa
    from attattr_cli.errors import OptionError

    before = pairs_file.read_bytes()
    model = str(tmp_path / "model")
    _refused(lambda: aa.circuit(model, pairs_file, out=pairs_file), OptionError, "out", "same file as an input")
    _refused(lambda: aa.circuit(model, str(pairs_file), json=str(pairs_file)), OptionError, "json", "same file")
    link = tmp_path / "link.h5"
    link.symlink_to(pairs_file)
    _refused(lambda: aa.circuit(model, pairs_file, out=link), OptionError, "same file as an input")
    _refused(lambda: aa.circuit(model, pairs_file, out="/dev/null"), OptionError, "device")
    _refused(lambda: aa.circuit(model, pairs_file, out=tmp_path), OptionError, "out")
    _refused(lambda: aa.circuit(model, pairs_file, json=tmp_path), OptionError, "json")
    _refused(lambda: aa.circuit(model, pairs_file, out=tmp_path / "c.h5", json=tmp_path / "c.h5"), OptionError,
             "json", "same file")
    assert pairs_file.read_bytes() == before
    assert _files(tmp_path) == ["link.h5", "pairs.jsonl"]


def test_cli_refuses_out_onto_data_and_a_device_before_loading(pairs_file, tmp_path, no_load):
    before = pairs_file.read_bytes()
    for args, needle in ((["--out", pairs_file], "--out"), (["--json", pairs_file], "--json"),
                         (["--out", "/dev/null"], "--out /dev/null is a device")):
        r = run_cli("circuit", "--model", tmp_path / "model", "--data", pairs_file, *args, "-q")
        assert r.exit_code == 2
        one_error_line(r, needle)
    assert pairs_file.read_bytes() == before


def test_circuit_save_and_plot_refuse_the_pairs_file_it_was_made_from(loaded, pairs_file, tmp_path):
    import attattr_cli as aa
    from attattr_cli.errors import OptionError

    res = aa.circuit(loaded, pairs_file, methods="random", bootstrap=10, split="none")
    assert res.data == str(pairs_file)
    before = pairs_file.read_bytes()
    _refused(lambda: res.save(pairs_file), OptionError, "path", "same file as an input")
    _refused(lambda: res.save("/dev/null"), OptionError, "device")
    _refused(lambda: res.save(tmp_path), OptionError, "path")
    _refused(lambda: res.plot(path=pairs_file), OptionError, "same file as an input")
    assert pairs_file.read_bytes() == before
    assert res.save(tmp_path / "c.h5") == str(tmp_path / "c.h5")
    assert _files(tmp_path) == ["c.h5", "pairs.jsonl"]  # no lock file left behind


# ----------------------------------------------------------------------------- 2. counterfactual = prompt


def test_a_counterfactual_that_is_its_prompt_is_refused_naming_the_pair(tmp_path, no_load):
    import attattr_cli as aa
    from attattr_cli.data.pairs import Pair
    from attattr_cli.errors import DataError

    rows = [p.to_json() for p in _pairs()]
    rows[2]["counterfactual"] = rows[2]["prompt"]
    data = tmp_path / "same.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _refused(lambda: aa.circuit("m", data), DataError, "same.jsonl line 3", "counterfactual is the prompt")
    _refused(lambda: aa.circuit("m", rows), DataError, "pairs[2]", "counterfactual is the prompt")
    pairs = _pairs()
    pairs[1] = Pair(1, "w1 w2", "w1 w2", ("w3",), ("w4",))
    _refused(lambda: aa.circuit("m", pairs), DataError, "pairs[1]")
    r = run_cli("circuit", "--model", tmp_path / "m", "--data", data, "-q")
    assert r.exit_code == 2
    one_error_line(r, "line 3", "counterfactual is the prompt itself")


def test_a_gap_within_noise_is_refused(loaded, tmp_path, llama_dir):
    """The tokenizer lowercases: a counterfactual in capitals differs as text and is the same
    tokens, so m(N) = m(empty) exactly under patching."""
    import attattr_cli as aa
    from attattr_cli.analysis.circuits.evaluate import check_gap
    from attattr_cli.errors import DataError

    check_gap(np.array([1.0, 2.0]), np.array([0.0, 0.5]))  # a real gap passes
    _refused(lambda: check_gap(np.array([3.0]), np.array([3.0 + 6e-9])), DataError,
             "do not change the metric", "undefined")
    _refused(lambda: check_gap(np.array([np.nan]), np.array([0.0])), DataError, "undefined")
    with pytest.raises(DataError, match=r"ablating every head \(zero\)"):
        check_gap(np.array([1.0]), np.array([1.0]), "zero")
    rows = [p.to_json() for p in _pairs()]
    for r in rows:
        r["counterfactual"] = r["prompt"].upper()
    _refused(lambda: aa.circuit(loaded, rows, methods="random", bootstrap=10), DataError,
             "the counterfactuals do not change the metric")
    data = tmp_path / "caps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "c.h5"
    r = run_cli("circuit", "--model", llama_dir, "--data", data, "--methods", "random", "--bootstrap", "10",
                "--out", out, "-q")
    assert r.exit_code == 2 and r.stdout == ""
    one_error_line(r, "do not change the metric")
    assert not out.exists()


# ----------------------------------------------------------------------------- 3. seeds, threads, bootstrap


def test_seed_threads_and_bootstrap_are_checked_before_the_model_loads(pairs_file, tmp_path, no_load):
    import attattr_cli as aa
    from attattr_cli.errors import OptionError

    for kw, needle in ((dict(seed=-1), "seed must be a whole number from 0 to 2**32 - 1, got -1"),
                       (dict(seed=2**32), "seed must be"),
                       (dict(threads=2**40), "threads must be at least 1 and at most"),
                       (dict(threads=0), "threads must be"),
                       (dict(threads=os.cpu_count() + 1), "CPUs"),
                       (dict(bootstrap=1_000_000_000), "bootstrap must be at least 10 and at most 100000"),
                       (dict(bootstrap=9), "bootstrap must be")):
        _refused(lambda: aa.circuit("m", pairs_file, **kw), OptionError, needle)
    for args, needle in ((["--seed", "-1"], "--seed must be"), (["--threads", str(2**40)], "--threads must be"),
                         (["--bootstrap", "1000000000"], "--bootstrap must be")):
        r = run_cli("circuit", "--model", tmp_path / "m", "--data", pairs_file, *args, "-q")
        assert r.exit_code == 2
        one_error_line(r, needle)


def test_threads_are_checked_wherever_the_api_takes_them(monkeypatch):
    import attattr_cli as aa
    from attattr_cli.engine.finetune import FinetuneOptions
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.errors import OptionError

    import attattr_cli.api.scoring as scoring

    monkeypatch.setattr(scoring, "using", lambda *a, **k: pytest.fail("the model was loaded"))
    _refused(lambda: aa.score(inputs=["w1 w2"], threads=2**40), OptionError, "threads must be", "CPUs")
    _refused(lambda: ScoreOptions(threads=2**40).check(), OptionError, "--threads must be between 1 and")
    _refused(lambda: FinetuneOptions(threads=2**40), OptionError, "--threads must be between 0 and")
    assert FinetuneOptions(threads=0).threads == 0
    r = run_cli("score", "--threads", str(2**40), "--out", "never.h5", "-q")
    assert r.exit_code == 2
    one_error_line(r, "--threads must be")
    assert not os.path.exists("never.h5")


def test_threads_run_and_torch_keeps_its_own_count(loaded, pairs_file, monkeypatch):
    import attattr_cli as aa
    from attattr_cli.engine import threads as th

    chosen = []
    real = th.choose
    monkeypatch.setattr(th, "choose", lambda *a, **k: chosen.append(real(*a, **k)) or chosen[-1])
    before = torch.get_num_threads()
    aa.circuit(loaded, pairs_file, methods="random", bootstrap=10, threads=1)
    aa.circuit(loaded, pairs_file, methods="random", bootstrap=10)  # chosen as score chooses: short prompts, 1
    assert chosen == [1, 1] and torch.get_num_threads() == before


# ----------------------------------------------------------------------------- 4. bounded reads


def test_pairs_are_read_with_bounds(tmp_path, monkeypatch, no_load):
    import attattr_cli as aa
    import attattr_cli.data.pairs as P
    from attattr_cli.errors import DataError

    _refused(lambda: aa.circuit("m", "/dev/zero"), DataError, "/dev/zero is not a regular file")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    _refused(lambda: aa.circuit("m", fifo), DataError, "not a regular file")  # and does not wait for a writer
    assert not P.is_pairs_file(fifo) and not P.is_pairs_file("/dev/zero")
    big = tmp_path / "big.jsonl"
    P.write_pairs(big, _pairs())
    monkeypatch.setattr(P, "MAX_BYTES", 100)
    _refused(lambda: aa.circuit("m", big), DataError, "larger than 100 bytes")
    monkeypatch.setattr(P, "MAX_BYTES", 256 * 2**20)
    monkeypatch.setattr(P, "MAX_LINE_BYTES", 50)
    _refused(lambda: aa.circuit("m", big), DataError, "big.jsonl line 1 is longer than 50 bytes")
    one_line = tmp_path / "line.jsonl"
    one_line.write_text("x" * 60)  # no newline at all
    assert not P.is_pairs_file(one_line)
    r = run_cli("circuit", "--model", tmp_path / "m", "--data", "/dev/zero", "-q")
    assert r.exit_code == 2
    one_error_line(r, "not a regular file")


# ----------------------------------------------------------------------------- 5. one writer, writable, Ctrl-C


def test_a_second_writer_of_an_output_is_refused_before_work(pairs_file, tmp_path, no_load):
    import attattr_cli as aa
    from attattr_cli.errors import OptionError

    out = tmp_path / "c.h5"
    out.write_bytes(b"the first run's result")
    lock = tmp_path / ".c.h5.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # another writer holds it (its own open file)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _refused(lambda: aa.circuit("m", pairs_file, out=out), OptionError, "being written by another process")
        r = run_cli("circuit", "--model", tmp_path / "m", "--data", pairs_file, "--out", out, "-q")
        assert r.exit_code == 2
        one_error_line(r, "--out", "being written by another process")
        js = tmp_path / "c.json"
        jlock = os.open(tmp_path / ".c.json.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(jlock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _refused(lambda: aa.circuit("m", pairs_file, json=js), OptionError, "json", "another process")
        finally:
            os.close(jlock)
    finally:
        os.close(fd)
    assert out.read_bytes() == b"the first run's result"


def test_the_lock_is_free_again_after_a_run_and_left_nowhere(loaded, pairs_file, tmp_path):
    import attattr_cli as aa
    from attattr_cli.fileio import one_writer

    out, js = tmp_path / "c.h5", tmp_path / "c.json"
    aa.circuit(loaded, pairs_file, methods="random", bootstrap=10, out=out, json=js)
    assert _files(tmp_path) == ["c.h5", "c.json", "pairs.jsonl"]
    with one_writer(out):  # free, and shared by what the holder calls
        with one_writer(out):
            assert (tmp_path / ".c.h5.lock").exists()
    assert not (tmp_path / ".c.h5.lock").exists()


def test_an_output_that_cannot_be_written_is_refused_before_work(pairs_file, tmp_path, monkeypatch, no_load):
    """The tests run as root, for whom every file is writable: os.access says what a user's would."""
    import attattr_cli as aa
    from attattr_cli.errors import OptionError

    folder = tmp_path / "ro"
    folder.mkdir()
    done = tmp_path / "done.h5"
    done.write_bytes(b"kept")
    real = os.access
    denied = {str(folder), str(done)}
    monkeypatch.setattr(os, "access", lambda p, mode, **k: str(p) not in denied and real(p, mode, **k))
    _refused(lambda: aa.circuit("m", pairs_file, out=folder / "c.h5"), OptionError, "ro is not writable",
             "nothing was computed")
    _refused(lambda: aa.circuit("m", pairs_file, json=folder / "c.json"), OptionError, "json", "not writable")
    _refused(lambda: aa.circuit("m", pairs_file, out=done), OptionError, "read-only")
    r = run_cli("circuit", "--model", tmp_path / "m", "--data", pairs_file, "--out", folder / "c.h5", "-q")
    assert r.exit_code == 2
    one_error_line(r, "--out", "not writable")
    r = run_cli("circuit", "--model", tmp_path / "m", "--data", pairs_file, "--plot", folder / "c.png", "-q")
    assert r.exit_code == 2
    one_error_line(r, "--plot", "not writable")
    with pytest.raises(OptionError, match="plot .* is the same file as json"):
        aa.circuit("m", pairs_file, json=tmp_path / "x.json", plot=tmp_path / "x.json")
    assert done.read_bytes() == b"kept" and _files(folder) == []


def test_ctrl_c_says_that_nothing_was_written(pairs_file, tmp_path, monkeypatch):
    import attattr_cli.api.circuits as api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "circuit", interrupted)
    r = run_cli("circuit", "--model", tmp_path / "m", "--data", pairs_file, "--out", tmp_path / "c.h5", "-q")
    assert r.exit_code == 130
    assert "Interrupted: nothing is written before the end, and each output is written whole or left untouched" in r.stderr
    assert "resume" not in r.stderr.replace("does not resume", "")


def test_a_behaviour_the_model_lacks_is_said_in_one_warning():
    """m(N) below m(empty): the ratio is defined, but there is no behaviour to find a circuit of."""
    from attattr_cli.analysis.circuits.evaluate import check_gap

    with pytest.warns(UserWarning, match="does not show this behaviour"):
        check_gap(np.array([0.4, 0.45]), np.array([0.5, 0.5]))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_gap(np.array([4.0, 5.0]), np.array([0.5, -0.5]))  # a behaviour: no warning
