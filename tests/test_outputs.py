"""The output rule (attattr_cli/fileio.py, docs/api.md "Outputs"), for every command that
writes, listed from the CLI itself so that a new command cannot skip it: an output that is
the same file as an input is refused with one line and the input left as it was; a
character device or a FIFO is written in place or refused with one line, never replaced."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from attattr_cli.fileio import check_output, is_stream, replaced, write_atomic
from attattr_cli.errors import OptionError
from conftest import build_model, one_error_line, run_cli


def _md5(path: Path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def writing_commands() -> dict[str, list[str]]:
    """Every command (``demo train`` as "demo train") with an --out or -o option: its flags."""
    from conftest import cli_commands

    found = {}
    for name, cmd in cli_commands().items():
        flags = [o for p in cmd.params for o in getattr(p, "opts", []) if o in ("--out", "-o")]
        if flags:
            found[name] = flags
    return found


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tokenizer):
    """A small store of the built-in default, and small input files of every other kind."""
    from conftest import WORDS

    d = tmp_path_factory.mktemp("outputs")
    store = d / "s.h5"
    r = run_cli("score", "--out", store, "--examples", "0:2", "--steps", 2, "-q")
    assert r.exit_code == 0, r.output
    trig = d / "t.json"
    r = run_cli("triggers", store, "--out", trig, "-q")
    assert r.exit_code == 0, r.output
    imp = d / "imp.h5"
    r = run_cli("importance", store, "--out", imp, "--methods", "attr", "-q")
    assert r.exit_code == 0, r.output
    data = d / "d.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{' '.join(WORDS[i:i + 5])}\t{i % 2}\n" for i in range(4)))
    (d / "attr.json").write_text("[]\n")
    (d / "tokens.json").write_text("[]\n")
    lm = d / "tiny-llama"  # a causal LM and counterfactual pairs for `circuit`
    build_model("llama", num_labels=2, layers=2, lm=True).save_pretrained(lm)
    tokenizer.save_pretrained(lm)
    pairs = d / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2} w{i}", "counterfactual": f"w{i + 5} w{i + 6} w{i + 7} w{i + 8}",
                                         "answer": f"w{i + 1}", "foil": f"w{i}"}) + "\n" for i in range(3)))
    return {"store": store, "triggers": trig, "importance": imp, "data": data, "dir": d, "lm": lm, "pairs": pairs}


def _same_as_input(cmd: str, f: dict) -> tuple[list, Path]:
    """The arguments of ``cmd`` with its output naming one of its inputs, and that input."""
    s = f["store"]
    cases = {
        "score": (["--data", f["data"], "--task", "sst2", "--out", f["data"]], f["data"]),
        "merge": ([s, "--out", s], s),
        "tree": ([s, "-n", 0, "-o", s], s),
        "import-json": ([f["dir"] / "attr.json", f["dir"] / "tokens.json", "--out", f["dir"] / "tokens.json"],
                        f["dir"] / "tokens.json"),
        "finetune": (["--data", f["data"], "--task", "sst2", "--model", f["dir"], "--out", f["data"]], f["data"]),
        "importance": ([s, "--out", s], s),
        "prune": (["--importance", f["importance"], "--out", f["importance"]], f["importance"]),
        "triggers": ([s, "--out", s], s),
        "attack": (["--triggers", f["triggers"], "--out", f["triggers"]], f["triggers"]),
        "faithfulness": ([s, "--out", s], s),
        "view": ([s, "-n", 0, "-o", s], s),
        "report": ([s, "-o", s], s),
        "convert": ([f["data"], "--out", f["data"]], f["data"]),
        "circuit": (["--model", f["lm"], "--data", f["pairs"], "--out", f["pairs"]], f["pairs"]),
        "demo data": None,  # no input
        "demo train": None,  # no input
    }
    return cases[cmd]


def _to_device(cmd: str, f: dict, dev: Path) -> list:
    s = f["store"]
    cases = {
        "score": ["--out", dev, "--examples", "0:1", "--steps", 2, "-q"],
        "merge": [s, "--out", dev],
        "tree": [s, "-n", 0, "-f", "json", "-o", dev, "-q"],
        "import-json": [f["dir"] / "attr.json", f["dir"] / "tokens.json", "--out", dev],
        "finetune": ["--out", dev],
        "importance": [s, "--out", dev, "--methods", "attr", "-q"],
        "prune": ["--importance", f["importance"], "--examples", "0:4", "--rates", "0,0.5", "--methods", "attr",
                  "--out", dev, "-q"],
        "triggers": [s, "--out", dev, "-q"],
        "attack": ["--triggers", f["triggers"], "--examples", "0:4", "--controls", 1, "--top", 1, "--out", dev, "-q"],
        "faithfulness": [s, "--out", dev, "--methods", "attention_last", "--permutations", 0, "-q"],
        "view": [s, "-n", 0, "-f", "svg", "-o", dev],
        "report": [s, "-o", dev],
        "convert": [f["data"], "--out", dev],
        "circuit": ["--model", f["lm"], "--data", f["pairs"], "--methods", "random", "--bootstrap", 10, "--out", dev, "-q"],
        "demo data": ["--out", dev, "--count", 3],
        "demo train": ["--out", dev],
    }
    return cases[cmd]


WRITERS = writing_commands()
# the commands whose output is one file: streamed into a device
STREAMED = {"attack", "faithfulness", "importance", "prune", "report", "tree", "triggers", "view"}


def test_every_writing_command_is_listed():
    """The cases below cover every command with an output option (a new one must be added)."""
    assert set(WRITERS) == {"score", "merge", "tree", "import-json", "finetune", "importance", "prune", "triggers",
                            "attack", "faithfulness", "view", "report", "convert", "circuit", "demo data", "demo train"}
    names = ("store", "triggers", "importance", "data", "dir", "lm", "pairs")
    for cmd in WRITERS:  # each has its cases below (an input as output; a device as output)
        assert (_same_as_input(cmd, {k: Path("x") for k in names}) is None) == (cmd in NO_INPUT)
        assert _to_device(cmd, {k: Path("x") for k in names}, Path("d"))


# the writing commands that read no file (nothing for their output to destroy)
NO_INPUT = {"demo data", "demo train"}


@pytest.mark.parametrize("cmd", sorted(set(WRITERS) - NO_INPUT))
def test_an_output_that_is_an_input_is_refused(cmd, inputs):
    args, victim = _same_as_input(cmd, inputs)
    before = _md5(victim)
    result = run_cli(*cmd.split(), *args)
    line = one_error_line(result)
    assert "same file as an input" in line or "is one of the shards" in line, line
    assert _md5(victim) == before


@pytest.fixture
def device(tmp_path):
    """A character device like /dev/null (made with mknod where allowed, else /dev/null itself,
    which a process without root cannot replace anyway)."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        if os.geteuid() == 0:
            pytest.skip("cannot make a character device here")
        return Path("/dev/null")
    return dev


@pytest.mark.parametrize("cmd", sorted(WRITERS))
def test_a_device_is_written_in_place_or_refused_never_replaced(cmd, inputs, device):
    result = run_cli(*cmd.split(), *_to_device(cmd, inputs, device))
    assert stat.S_ISCHR(os.stat(device).st_mode), f"{cmd} replaced the device"
    if cmd in STREAMED:
        assert result.exit_code == 0, result.output
    else:  # a store or a folder cannot be streamed; demo data never writes over a file
        one_error_line(result, str(device))
    assert "Traceback" not in result.output


def test_links_and_hard_links_to_an_input_are_refused(inputs, tmp_path):
    store = inputs["store"]
    soft, hard = tmp_path / "soft.json", tmp_path / "hard.json"
    soft.symlink_to(store)
    os.link(store, hard)
    before = _md5(store)
    for out in (soft, hard):
        one_error_line(run_cli("triggers", store, "--out", out, "-q"), "same file as an input")
        with pytest.raises(OptionError, match="same file as an input"):
            check_output(out, [str(store)])
    assert _md5(store) == before and soft.is_symlink()


def test_a_fifo_is_streamed(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, b"one\n")
    reader.join(10)
    assert got == [b"one\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    with replaced(fifo, suffix=".json") as tmp:
        tmp.write_text("two\n")
    reader.join(10)
    assert got[1] == b"two\n" and is_stream(fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_an_output_named_twice_is_refused(inputs, tmp_path):
    """--out and --plot (or --csv) naming one existing file would write over each other."""
    out = tmp_path / "x.json"
    out.write_text("{}\n")
    r = run_cli("triggers", inputs["store"], "--out", out, "--csv", out, "-q")
    one_error_line(r, "same file as an input")
    assert json.loads(out.read_text()) == {}


# -- a write without room: one line, exit status 5, nothing replaced, a rerun completes ----

REPO = Path(__file__).resolve().parents[1]


def _limited(limit: int):
    """preexec_fn: the file size limit (``ulimit -f``) of the child."""
    import resource

    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _cli_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def _cli_limited(args, limit: int | None, cwd):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "attattr_cli", *map(str, args)], capture_output=True, text=True,
                          env=_cli_env(), cwd=cwd, timeout=600, preexec_fn=None if limit is None else _limited(limit))


@pytest.mark.parametrize("cmd,out", [("importance", "imp.h5"), ("report", "rep/")])  # HDF5; a folder
def test_a_file_size_limit_is_one_line_and_exit_5(cmd, out, inputs, tmp_path):
    """Under `ulimit -f` the write fails with EFBIG (SIGXFSZ ignored): no signal death, no
    traceback, the one line of every write without room; the old output is left whole and a
    rerun with room completes."""
    target = tmp_path / out
    args = [cmd, inputs["store"], "-o", target, *(["-n", 0] if cmd == "view" else []),
            *(["-q"] if cmd in ("importance", "triggers") else [])]
    before = _md5(inputs["store"])
    proc = _cli_limited(args, 1024, tmp_path)
    assert proc.returncode == 5, proc.stderr
    line = one_error_line(type("R", (), {"returncode": 5, "stderr": "\n".join(
        x for x in proc.stderr.splitlines() if not x.startswith(("note:", "report:"))), "stdout": proc.stdout})())
    assert "the file size limit was reached (File too large); nothing was replaced: free some space and run the" \
           " same command again" in line
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary file left
    assert _md5(inputs["store"]) == before
    again = _cli_limited(args, None, tmp_path)
    assert again.returncode == 0, again.stderr
    assert target.exists()


def test_faithfulness_rerun_after_a_failed_write_completes(inputs, tmp_path):
    """Token importance kept in a store (--importance-store) whose write failed midway (the
    file size limit): one line, exit 5; the rerun with room repairs the store and completes;
    the store read is never changed."""
    import shutil

    kept = tmp_path / "kept.h5"
    shutil.copyfile(inputs["store"], kept)
    before = _md5(inputs["store"])
    args = ["faithfulness", inputs["store"], "--out", tmp_path / "f.json", "--permutations", 0,
            "--methods", "attr,random", "--importance-store", kept, "-q"]
    from test_store_hardening import CliAhead

    # the rerun (no limit) imports beside the limited run and runs after it
    with CliAhead(*args, cwd=tmp_path, env=_cli_env()) as rerun:
        proc = _cli_limited(args, kept.stat().st_size + 2048, tmp_path)
        assert proc.returncode == 5, proc.stderr
        assert "Traceback" not in proc.stderr and "the file size limit was reached" in proc.stderr
        again = rerun.run()
    assert again.returncode == 0, again.stderr
    from attattr_cli.store import Store, read_token_importance

    with Store(kept) as s:
        assert all({"attr", "random", "loo", "grad"} <= set(read_token_importance(s, i)) for i in s.indices())
    assert json.loads((tmp_path / "f.json").read_text())["examples"] == 2
    assert _md5(inputs["store"]) == before


def test_prune_effectiveness_store_as_out_is_refused(inputs):
    s = inputs["store"]
    before = _md5(s)
    one_error_line(run_cli("prune", "--effectiveness", s, "--out", s, "-q"), "--out", "same file as an input")
    with pytest.raises(OptionError, match="same file as an input"):
        import attattr_cli as aa

        aa.prune(effectiveness=str(s), out=str(s))
    assert _md5(s) == before


def test_dev_stdout_is_written_through_stdout_not_replaced(inputs, tmp_path):
    """`-o /dev/stdout` with stdout redirected to a file: the output goes to that file after
    what was printed before it (no truncation, nothing written over); the link stays."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    target = tmp_path / "captured.txt"
    with open(target, "wb") as fh:
        fh.write(b"before\n")
        fh.flush()
        proc = subprocess.run([sys.executable, "-m", "attattr_cli", "tree", str(inputs["store"]), "-n", "0", "-f", "json",
                               "-o", "/dev/stdout", "-q"], stdout=fh, stderr=subprocess.PIPE, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = target.read_text()
    assert text.startswith("before\n{")
    assert json.loads(text[len("before\n"):].strip())["example"] == 0
    assert os.path.islink("/dev/stdout") or not os.path.exists("/dev/stdout")
