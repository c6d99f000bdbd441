"""Stores under a full disk, a file size limit, a symlink, a read-only file system, a
truncation, and readers during a write (docs/store.md, "Guarantees")."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.run import ScoreRequest, score_to_store
from attattr_cli.errors import StoreError
from attattr_cli.store import Store
from attattr_cli.store.schema import EXAMPLES, PARTIAL_PREFIX

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
SCORE = ["score", "--examples", "0:12", "--steps", "4", "--group", "1", "--quiet"]  # one example per write

# the CLI under a file size limit (`ulimit -f`) that the free space check is not told about,
# as with a disk quota: the write itself fails (EFBIG; SIGXFSZ ignored so that it is an error)
LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
import attattr_cli.store.writer as writer
writer.file_size_room = lambda path: None
import os
if os.environ.get("MAPS_BY_HDF5_FILTERS") == "1":  # maps deflated by HDF5's own pipeline, as before store/compress.py
    import attattr_cli.store.compress as compress, attattr_cli.store.family as family
    family.write_maps = lambda create, name, arr, started=None: create(
        name, data=arr, chunks=(1, *arr.shape[1:]) if arr.size else None, **(compress.FILTERS if arr.size else {}))
from attattr_cli.cli import app
sys.argv = ["attattr"] + sys.argv[2:]
app()
"""


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attattr_cli", *map(str, args)], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=600)


# `python -m attattr_cli ARGS` started ahead of its turn: the process imports what scoring
# needs (torch, transformers: ~5 s of one core) while the test does something else, waits
# until the test says go (a byte on the file descriptor argv[1]), then runs the module as
# `python -m` does.  One process per command, never reused; only the imports come early.
AHEAD = """
import os, runpy, sys
import attattr_cli.cli, attattr_cli.engine.run
go = int(sys.argv.pop(1))
os.read(go, 1)
os.close(go)
runpy.run_module("attattr_cli", run_name="__main__", alter_sys=True)
"""


class CliAhead:
    """``attattr ARGS`` in a process that starts now and runs when :meth:`run` is called
    (the commands of a test that must run one after another, started side by side)."""

    def __init__(self, *args, cwd=None, env=None):
        go, self._go = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", AHEAD, str(go), *map(str, args)], pass_fds=(go,),
                                     env=ENV if env is None else env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        os.close(go)

    def run(self, timeout: float = 600) -> subprocess.CompletedProcess:
        os.write(self._go, b"1")
        os.close(self._go)
        self._go = None
        out, err = self.proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def close(self) -> None:
        """Kill the process if it was never run (the test failed or skipped before its turn)."""
        if self._go is not None:
            os.close(self._go)
            self._go = None
            self.proc.kill()
            self.proc.communicate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _examples(path) -> dict[int, dict]:
    """Every example's arrays and attributes, to compare stores."""
    out = {}
    with Store(path) as s:
        for i in s.indices():
            e = s.get(i)
            out[i] = {"attribution": e.attribution, "attention": e.attention, "logits": e.logits,
                      "residual": e.residual, "tokens": e.tokens, "pred": e.pred}
    return out


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for i in a:
        for key, value in a[i].items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, b[i][key])
            else:
                assert value == b[i][key]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The store of an uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "ref.h5"
    proc = _cli(*SCORE, "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("filters,behind", [("1", "0"), ("0", "0"), ("0", "1")],
                         ids=["hdf5-filters", "direct-chunks", "direct-chunks-written-behind"])
def test_write_failing_midway_is_one_line_and_the_next_run_recovers(tmp_path, reference, filters, behind):
    """A write that fails (file size limit; a full disk the check could not foresee) ends the
    run with one Error line and exit 5 (as every write without room), no crash; the examples
    written before stay readable; a run with room finishes. Where the failure left the store
    shorter than HDF5 recorded (maps through HDF5's own filters fail so), the run copies them
    into a fresh file first and says so in one line. The same where examples are written behind,
    on the store's own thread (a GPU run's default)."""
    out = tmp_path / "s.h5"
    env = dict(ENV, ATTATTR_WRITE_BEHIND=behind, MAPS_BY_HDF5_FILTERS=filters)
    with CliAhead(*SCORE, "--out", out) as rerun:  # imports beside the first run, runs after it
        proc = subprocess.run([sys.executable, "-c", LIMITED, str(reference.stat().st_size // 3), *SCORE, "--out",
                               out], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 5, proc.stderr
        line = _one_error_line(proc)
        assert "the file size limit was reached" in line and "run the same command again to resume" in line
        with Store(out) as s:
            kept = s.indices()
            cut = s.cut_short  # (a store HDF5 left shorter than it recorded: read as far as it goes)
        assert cut or filters == "0"
        assert 0 < len(kept) < 12
        full = _examples(reference)
        _same(_examples(out), {i: full[i] for i in kept})
        again = rerun.run()
    assert again.returncode == 0, again.stderr
    notes = [line for line in again.stderr.splitlines() if "copied into a fresh file" in line]
    # a store cut short is copied into a fresh file, in one line; one HDF5 left whole (the maps'
    # chunks are written directly, store/compress.py) resumes in place
    assert (len(notes) == 1 and f"its {len(kept)} complete examples" in notes[0]) if cut else not notes
    _same(_examples(out), full)
    with h5py.File(out, "r") as f:
        assert not [n for n in f[EXAMPLES] if n.startswith(PARTIAL_PREFIX)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_leftover_partial_that_hdf5_cannot_delete_is_recovered(tmp_path, reference, monkeypatch):
    """Where HDF5 cannot delete a leftover partial example in place, the writer copies the
    complete examples into a fresh file and swaps it in."""
    import shutil

    out = tmp_path / "s.h5"
    shutil.copy(reference, out)
    with h5py.File(out, "r+") as f:
        f[EXAMPLES].copy(f[EXAMPLES]["00000003"], PARTIAL_PREFIX + "00000012")
        del f[EXAMPLES]["00000003"]
    real_delitem = h5py.Group.__delitem__

    def failing(self, name):
        if name.startswith(PARTIAL_PREFIX):
            raise KeyError("Couldn't delete link (addr overflow, addr = 1, size = 2, eoa = 3)")
        return real_delitem(self, name)

    monkeypatch.setattr(h5py.Group, "__delitem__", failing)
    from attattr_cli.store import StoreWriter

    with Store(reference) as s:
        fingerprint = {k: v for k, v in s.fingerprint.items() if k != "store_dtype"}
    with StoreWriter(out, fingerprint, {}) as w:
        assert sorted(w.done) == [i for i in range(12) if i != 3]
        assert len(w.notes) == 1 and "its 11 complete examples were copied into a fresh file" in w.notes[0]
    monkeypatch.undo()
    full = _examples(reference)
    _same(_examples(out), {i: full[i] for i in range(12) if i != 3})


def test_full_disk_is_checked_before_each_example(tmp_path, reference):
    """On a small tmpfs the free space check stops the run before the write that would not
    fit: one Error line, the examples written are complete, a run with space resumes."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the file size limit test covers the failing write")
    moved = tmp_path / "s.h5"
    with CliAhead(*SCORE, "--out", moved) as rerun:  # imports beside the first run, runs after it
        try:
            proc = _cli(*SCORE, "--out", small / "s.h5")
            assert proc.returncode == 5, proc.stderr
            line = _one_error_line(proc)
            assert "not enough space to write example" in line and "are free on the disk" in line
            with h5py.File(small / "s.h5", "r") as f:
                assert not [n for n in f[EXAMPLES] if n.startswith(PARTIAL_PREFIX)]
            with Store(small / "s.h5") as s:
                kept = s.indices()
            assert 0 < len(kept) < 12
            moved.write_bytes((small / "s.h5").read_bytes())
        finally:
            subprocess.run(["umount", str(small)], capture_output=True)
        again = rerun.run()
    assert again.returncode == 0, again.stderr
    _same(_examples(moved), _examples(reference))


def test_new_store_replaces_a_dangling_symlink_and_gets_the_usual_mode(tmp_path, tiny_model_dir, sst2_small):
    target = tmp_path / "elsewhere" / "target.h5"
    target.parent.mkdir()
    link = tmp_path / "dangling.h5"
    link.symlink_to(target)
    old = os.umask(0o022)
    try:
        score_to_store(ScoreRequest(out=str(link), model=str(tiny_model_dir), data=str(sst2_small), task="sst2",
                                    examples="0:2", options=ScoreOptions(steps=2), device="cpu"))
    finally:
        os.umask(old)
    assert not link.is_symlink() and link.is_file()
    assert not target.exists()
    assert stat.S_IMODE(link.stat().st_mode) == 0o644
    with Store(link) as s:
        assert s.indices() == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.h5", "elsewhere", "small.tsv"]


def test_truncated_store_is_damaged_not_locked(tmp_path, reference):
    cut = tmp_path / "cut.h5"
    cut.write_bytes(reference.read_bytes()[: reference.stat().st_size // 2])
    before = cut.read_bytes()
    proc = _cli("info", cut)
    line = _one_error_line(proc)
    assert proc.returncode == 4
    assert "another process" not in line and "damaged" in line and "shorter than HDF5 recorded" in line
    assert cut.read_bytes() == before


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` on a read-only file system (a read-only tmpfs as root), or, for another
    user, a file and folder without write permission."""
    if os.geteuid() != 0:
        files = list(folder.iterdir())
        for p in files:
            p.chmod(0o444)
        folder.chmod(0o555)
        try:
            yield "permission denied"
        finally:
            folder.chmod(0o755)
            for p in files:
                p.chmod(0o644)
        return
    ro = folder.parent / (folder.name + "-ro")
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        for p in folder.iterdir():
            (ro / p.name).write_bytes(p.read_bytes())
        assert subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True).returncode == 0
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_read_only_store_rerun_with_nothing_to_do_succeeds(tmp_path, reference):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "s.h5").write_bytes(reference.read_bytes())
    with _read_only(folder) as where:
        where = folder if isinstance(where, str) else where
        store = where / "s.h5"
        # both score runs import side by side; each runs when its turn comes
        with CliAhead(*SCORE, "--out", store) as first, \
                CliAhead("score", "--examples", "0:13", "--steps", "4", "--quiet", "--out", store) as second:
            done = first.run()
            assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
            info = _cli("info", store, "--json")
            assert info.returncode == 0 and json.loads(info.stdout)["examples"] == 12
            more = second.run()
        line = _one_error_line(more)
        assert more.returncode == 4 and f"cannot write to {store}" in line
        assert "read-only file system" in line or "permission denied" in line


# a writer that scores slowly: it waits while the file ``hold`` exists once 3 examples are
# written, then pauses a little at each layer
SLOW_WRITER = """
import os, sys, time
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.run import ScoreRequest, score_to_store
out, hold = sys.argv[1], sys.argv[2]

def progress(done, total, label):
    if label == "example 3":
        while os.path.exists(hold):
            time.sleep(0.05)
    time.sleep(0.02)

score_to_store(ScoreRequest(out=out, examples="0:16", options=ScoreOptions(steps=8, group=1), device="cpu"), progress=progress)
"""


def test_readers_see_complete_examples_while_a_writer_writes(tmp_path):
    """A writer process scores slowly; `attattr info --json` and the Python reader, polled
    meanwhile, always succeed and list a growing number of complete examples, each readable
    whole; a second writer gets one Error line."""
    out, hold = tmp_path / "live.h5", tmp_path / "hold"
    hold.touch()
    writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(out), str(hold)], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the second writer imports beside the first and runs once 3 examples are written
    second_writer = CliAhead("score", "--out", out, "--examples", "0:16", "--steps", "8", "--quiet")
    counts = []

    def poll():
        proc = _cli("info", out, "--json")
        assert proc.returncode == 0, proc.stderr
        counts.append(json.loads(proc.stdout)["examples"])
        with Store(out) as s:
            for i in s.indices():
                e = s.get(i)
                assert e.attribution.shape[-1] == len(e.tokens) and np.isfinite(e.attribution).all()

    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if out.exists() and _cli("info", out, "--json").returncode == 0:
                with Store(out) as s:
                    if len(s) >= 3:
                        break
            time.sleep(0.2)
        second = second_writer.run()
        line = _one_error_line(second)
        assert second.returncode == 4 and "is open for writing in another process" in line
        poll()
        hold.unlink()
        while writer.poll() is None and time.monotonic() < deadline:
            poll()
        assert writer.wait(timeout=300) == 0, writer.stderr.read()
    finally:
        second_writer.close()
        if writer.poll() is None:
            writer.kill()
    poll()
    assert counts == sorted(counts) and counts[0] == 3 and counts[-1] == 16, counts
    assert len(set(counts)) >= 3, counts  # it read while the writer went on


def test_score_refuses_a_pruned_model_folder_in_one_line(tmp_path, tokenizer, sst2_small):
    """A folder written by `attattr prune --save-model` (heads sliced per layer, loadable only
    with its own model code) is refused with one line saying why, not a transformers traceback."""
    from attattr_cli.analysis.prune import load_pruned, save_pruned
    from conftest import build_model

    kept = [[0, 1], [2], [0, 1, 2, 3]]
    save_pruned(build_model("bert", num_labels=2), tokenizer, kept, tmp_path / "pm")
    assert [a.num_attention_heads for a in (layer.attention.self for layer in load_pruned(tmp_path / "pm").bert.encoder.layer)] == [2, 1, 4]
    proc = _cli("score", "--model", tmp_path / "pm", "--data", sst2_small, "--task", "sst2", "--out", tmp_path / "s.h5")
    line = _one_error_line(proc)
    assert proc.returncode == 3
    assert "pruned by attattr prune --save-model (heads kept per layer: 2/1/4)" in line
    assert not (tmp_path / "s.h5").exists()


def test_readers_during_a_faithfulness_run(tmp_path, reference):
    """`faithfulness --importance-store STORE` adds token importance to the store's own
    examples; `info --json` polled meanwhile always succeeds and lists every example."""
    store = tmp_path / "s.h5"
    store.write_bytes(reference.read_bytes())
    writer = subprocess.Popen([sys.executable, "-m", "attattr_cli", "faithfulness", str(store), "--out",
                               str(tmp_path / "f.json"), "--methods", "attr,random", "--permutations", "60", "-q",
                               "--importance-store", str(store)],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    polls = during = 0
    try:
        while writer.poll() is None:
            proc = _cli("info", store, "--json")
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["examples"] == 12
            polls += 1
            during += writer.poll() is None
        assert writer.wait(timeout=600) == 0, writer.stderr.read()
    finally:
        if writer.poll() is None:
            writer.kill()
    assert during >= 1, polls
    from attattr_cli.store import read_token_importance

    with Store(store) as s:
        assert all(set(read_token_importance(s, i)) >= {"attr", "random"} for i in s.indices())


def test_two_writers_creating_one_store_the_first_link_wins(tmp_path, reference, monkeypatch):
    """Another process creates the store between this writer's skeleton and its link: the
    link fails, the temporary file goes, and the writer opens the other's store (here free;
    held by a running writer it would get the one "open for writing" line)."""
    import attattr_cli.store.writer as writer_mod
    from attattr_cli.store import StoreWriter

    out = tmp_path / "s.h5"
    real_link = os.link

    def other_process_first(src, dst):
        Path(dst).write_bytes(reference.read_bytes())
        return real_link(src, dst)

    monkeypatch.setattr(writer_mod.os, "link", other_process_first)
    with Store(reference) as s:
        fingerprint = {k: v for k, v in s.fingerprint.items() if k != "store_dtype"}
    with StoreWriter(out, fingerprint, {}) as w:
        assert not w.created and sorted(w.done) == list(range(12))
    assert [p.name for p in tmp_path.iterdir()] == ["s.h5"]
    assert out.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"
