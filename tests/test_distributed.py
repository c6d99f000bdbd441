"""Scoring under torchrun (2 CPU processes, gloo), the token balance, merge checks, OOM back-off."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attattr_cli.cli import app
from attattr_cli.engine import distributed
from attattr_cli.engine.run import ScoreRequest, prepare_run, score_into, score_to_store
from attattr_cli.engine.scorer import Scorer
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.errors import DistributedError, ResourceError
from attattr_cli.store import Store
from attattr_cli.store.schema import SHARD_EXAMPLES
from conftest import DIST_STEPS, one_error_line
from torchrun_util import torchrun

runner = CliRunner()
STEPS = DIST_STEPS


def assert_same_examples(merged: Path, single: Path, indices: list[int]) -> None:
    """``merged`` holds exactly ``indices``, each equal to the single-process run's."""
    with Store(merged) as m, Store(single) as s:
        assert m.indices() == indices
        assert m.fingerprint == s.fingerprint
        for i in indices:
            a, b = m.get(i), s.get(i)
            assert a.tokens == b.tokens and np.array_equal(a.input_ids, b.input_ids)
            assert (a.gold, a.pred, a.target) == (b.gold, b.pred, b.target)
            np.testing.assert_allclose(a.attribution, b.attribution, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a.attention, b.attention, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a.residual, b.residual, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a.f_baseline, b.f_baseline, rtol=1e-5, atol=1e-6)
            assert a.f_full == pytest.approx(b.f_full, abs=1e-6)


# -- the split -------------------------------------------------------------------------

def test_balance_by_tokens_is_deterministic_complete_and_even():
    rng = np.random.default_rng(0)
    tokens = {i: int(n) for i, n in enumerate(rng.integers(5, 128, size=500))}
    parts = distributed.balance(tokens, 4)
    assert parts == distributed.balance(dict(reversed(list(tokens.items()))), 4)  # order of the dict is irrelevant
    assert sorted(i for p in parts for i in p) == sorted(tokens)
    assert all(p == sorted(p) for p in parts)
    loads = [sum(tokens[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(tokens.values())
    assert distributed.imbalance(tokens, parts) < 1.01
    # by example count alone the split would be even in examples, not in tokens
    long_short = {0: 100, 1: 100, 2: 10, 3: 10, 4: 10, 5: 10}
    parts = distributed.balance(long_short, 2)
    assert parts == [[0, 2, 4], [1, 3, 5]]
    assert distributed.balance({0: 100, 1: 10, 2: 10, 3: 10}, 2) == [[0], [1, 2, 3]]
    assert distributed.balance({}, 3) == [[], [], []]


def test_detect_and_paths():
    assert distributed.detect({}) is None
    env = distributed.detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.master, env.shard) == (3, 4, 1, "node0:29500", "3/4")
    with pytest.raises(DistributedError, match="does not fit WORLD_SIZE=2"):
        distributed.detect({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(DistributedError, match="are not numbers"):
        distributed.detect({"RANK": "x", "WORLD_SIZE": "2"})
    assert distributed.shard_path("/data/scores.h5", 1, 4) == Path("/data/scores.rank1-of-4.h5")
    assert distributed.rank_device("cpu", env) == "cpu"
    if not torch.cuda.is_available():
        assert distributed.rank_device("auto", env) == "cpu"


# -- torchrun --------------------------------------------------------------------------

def test_torchrun_two_processes_equal_one_process(tmp_path, single):
    result = torchrun("-m", "attattr_cli", "score", "--out", "s.h5", "--examples", "0:30", "--steps", STEPS, "-q",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "s.h5"  # rank 0 alone prints the store
    assert "scored 30 examples on 2 processes (0 already in the shards, 0 already in s.h5)" in result.stderr
    ratio = float(re.search(r"imbalance (\d+\.\d+)", result.stderr).group(1))
    assert 1.0 <= ratio < 1.1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]  # shards merged and deleted
    assert_same_examples(tmp_path / "s.h5", single, list(range(30)))
    with Store(tmp_path / "s.h5") as s:
        prov = s.provenance
        assert s.root_attrs["shard"] == ""
    (merge_entry,) = prov["merges"]
    assert [m["shard"] for m in merge_entry["shards"]] == ["0/2", "1/2"]
    assert merge_entry["added"] == 30 and sum(m["examples"] for m in merge_entry["shards"]) == 30
    assert sorted(r["rank"] for r in prov["runs"]) == [0, 1]
    assert all(r["world_size"] == 2 for r in prov["runs"])


def test_torchrun_through_the_entry_point_extends_a_store_and_keeps_shards(tmp_path, single):
    exe = Path(sys.executable).parent / "attattr"
    if not exe.exists():
        pytest.skip("the attattr entry point is not installed beside this Python")
    out = tmp_path / "s.h5"
    score_to_store(ScoreRequest(out=str(out), examples="0:20", options=ScoreOptions(steps=STEPS), device="cpu",
                                command=["test"]))
    result = torchrun(exe, "score", "--out", out, "--examples", "0:40", "--steps", STEPS, "-q", "--keep-shards",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"scored 20 examples on 2 processes (0 already in the shards, 20 already in {out})" in result.stderr
    assert "shards kept" in result.stderr
    shards = [distributed.shard_path(out, k, 2) for k in range(2)]
    given = []
    for k, path in enumerate(shards):
        with Store(path) as s:
            assert s.root_attrs["shard"] == f"{k}/2"
            assigned = [int(i) for i in s.f[SHARD_EXAMPLES][()]]
            assert s.indices() == assigned
            given.append(assigned)
    assert sorted(given[0] + given[1]) == list(range(20, 40))
    assert_same_examples(out, single, list(range(40)))
    # merging the kept shards again adds nothing
    again = runner.invoke(app, ["merge", *map(str, shards), "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "merged 0 examples (20 already present)" in again.stderr


def test_torchrun_refuses_a_store_of_other_options_with_one_error_line(tmp_path):
    out = tmp_path / "s.h5"
    score_to_store(ScoreRequest(out=str(out), examples="0:2", options=ScoreOptions(steps=STEPS), device="cpu",
                                command=["test"]))
    before = out.read_bytes()
    result = torchrun("-m", "attattr_cli", "score", "--out", "s.h5", "--examples", "0:4", "--steps", STEPS + 1, "-q",
                      cwd=tmp_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == [f"Error: s.h5 was made with other options (steps={STEPS} there, {STEPS + 1} here):"
                      " use the same options or another output store"]
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]


# -- attattr merge -----------------------------------------------------------------------

def _shard(tmp_path, name, model, data, indices, k, n, steps=STEPS):
    req = ScoreRequest(out=str(tmp_path / name), model=str(model), data=str(data), task="sst2",
                       options=ScoreOptions(steps=steps), device="cpu", command=["test"])
    prep = prepare_run(req)
    score_into(prep, indices=indices, shard=f"{k}/{n}" if n else "")
    return tmp_path / name


def test_merge_checks_options_completeness_ranks_and_overlap(tmp_path, tiny_model_dir, other_model_dir, sst2_small):
    a = _shard(tmp_path, "a.h5", tiny_model_dir, sst2_small, [0, 2, 4], 0, 2)
    b = _shard(tmp_path, "b.h5", tiny_model_dir, sst2_small, [1, 3, 5], 1, 2)
    out = tmp_path / "m.h5"
    ok = runner.invoke(app, ["merge", str(a), str(b), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.strip() == str(out) and "merged 6 examples (0 already present)" in ok.stderr
    with Store(out) as s:
        assert s.indices() == list(range(6))
        prov = s.provenance
        assert SHARD_EXAMPLES not in s.f and s.root_attrs["shard"] == ""
    assert [m["file"] for m in prov["merges"][0]["shards"]] == ["a.h5", "b.h5"]
    assert sorted(r["shard"] for r in prov["runs"]) == ["0/2", "1/2"]

    c = _shard(tmp_path, "c.h5", tiny_model_dir, sst2_small, [0, 1], 1, 2, steps=STEPS + 1)
    bad = runner.invoke(app, ["merge", str(a), str(c), "--out", str(tmp_path / "x.h5")])
    assert one_error_line(bad) == f"Error: cannot merge c.h5 with a.h5: they were made with other options (steps={STEPS + 1} in c.h5, {STEPS} in a.h5)"
    assert bad.exit_code == 4 and not (tmp_path / "x.h5").exists()

    d = _shard(tmp_path, "d.h5", other_model_dir, sst2_small, [6], 0, 0)
    bad = runner.invoke(app, ["merge", str(d), "--out", str(out)])
    assert one_error_line(bad).startswith("Error: cannot merge d.h5 into m.h5: they were made with other models")

    missing = runner.invoke(app, ["merge", str(a), "--out", str(tmp_path / "y.h5")])
    assert one_error_line(missing) == ("Error: cannot merge: the shards of rank 1 of 2 are missing (copy them here from the"
                               " machines that wrote them) (or merge what is there with --partial)")
    assert not (tmp_path / "y.h5").exists()

    # a shard whose process was given 3 examples but wrote 1 (interrupted)
    e = _shard(tmp_path, "e.h5", tiny_model_dir, sst2_small, [1], 1, 2)
    with h5py.File(e, "a") as f:
        del f[SHARD_EXAMPLES]
        f[SHARD_EXAMPLES] = np.array([1, 3, 5])
    cut = runner.invoke(app, ["merge", str(a), str(e), "--out", str(tmp_path / "z.h5")])
    assert "e.h5 lacks 2 of the examples its process was given (3, 5): it was interrupted" in one_error_line(cut)
    assert not (tmp_path / "z.h5").exists()
    part = runner.invoke(app, ["merge", str(a), str(e), "--out", str(tmp_path / "z.h5"), "--partial"])
    assert part.exit_code == 0 and "Warning: e.h5 lacks 2" in part.stderr
    with Store(tmp_path / "z.h5") as s:
        assert s.indices() == [0, 1, 2, 4]

    # plain stores (no torchrun) that overlap: each example taken once, and said so
    p = _shard(tmp_path, "p.h5", tiny_model_dir, sst2_small, [0, 1, 2], 0, 0)
    q = _shard(tmp_path, "q.h5", tiny_model_dir, sst2_small, [2, 3], 0, 0)
    both = runner.invoke(app, ["merge", str(p), str(q), "--out", str(tmp_path / "pq.h5")])
    assert both.exit_code == 0, both.output
    assert "Note: 1 example (2) in more than one shard; each is taken once, from the first shard that holds it" in both.stderr
    assert "merged 4 examples (1 already present)" in both.stderr
    same = runner.invoke(app, ["merge", str(p), str(p), "--out", str(tmp_path / "pp.h5")])
    assert one_error_line(same) == f"Error: {p} is given twice"
    into_shard = runner.invoke(app, ["merge", str(p), str(q), "--out", str(q)])
    # the output rule (fileio.check_output) refuses it before merge looks at the shards
    assert one_error_line(into_shard) == (f"Error: --out {q} is the same file as an input: writing it would destroy"
                                          " the input; choose another output")


# -- out-of-memory back-off ----------------------------------------------------------------

def _fake_oom(monkeypatch, fits: int, sizes: list):
    from attattr_cli.engine import sweep

    real, real_sweep = Scorer._step_chunk, sweep._pass

    def too_many(a):
        sizes.append(len(a))
        if len(a) > fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by a test)")

    def step_chunk(self, *args):  # (enc, site, target, clean, alphas, weights)
        too_many(args[-2])
        return real(self, *args)

    def sweep_pass(*args, **kw):  # (scorer, enc, family, target, clean, row_layer, alphas, weights, saved[, used])
        too_many(args[6])
        return real_sweep(*args, **kw)

    monkeypatch.setattr(Scorer, "_step_chunk", step_chunk)
    monkeypatch.setattr(sweep, "_pass", sweep_pass)


@pytest.mark.parametrize("swept", [False, True], ids=["per-layer", "sweeps"])
def test_oom_back_off_halves_the_step_batch_and_says_so_once(tmp_path, monkeypatch, tiny_model_dir, sst2_small, swept):
    def req(name):
        return ScoreRequest(out=str(tmp_path / name), model=str(tiny_model_dir), data=str(sst2_small), task="sst2",
                            examples="0:3", options=ScoreOptions(steps=9, group=1), device="cpu", command=["test"])

    monkeypatch.setattr(Scorer, "sweep", swept)
    score_to_store(req("plain.h5"))
    sizes: list[int] = []
    _fake_oom(monkeypatch, fits=2, sizes=sizes)
    said: list[str] = []
    score_to_store(req("backoff.h5"), warn=said.append)
    assert len(said) == 1 and "halving the step micro-batch" in said[0]
    # 9 right-rule steps, alpha = 1 shared: 8 in the first pass (a sweep: 8 for each of the 3
    # layers), then halved until it fits
    assert (sizes[:3] == [8, 4, 2]) if not swept else (sizes[:5] == [24, 12, 6, 3, 2]), sizes
    assert max(sizes[5 if swept else 3:]) <= 2  # the lowered size is kept for the next passes and examples
    with Store(tmp_path / "plain.h5") as p, Store(tmp_path / "backoff.h5") as b:
        for i in range(3):
            np.testing.assert_allclose(b.get(i).attribution, p.get(i).attribution, rtol=1e-5, atol=1e-7)


def test_oom_at_one_step_is_a_resource_error_with_exit_code_5(tmp_path, monkeypatch, tiny_model_dir, sst2_small):
    sizes: list[int] = []
    _fake_oom(monkeypatch, fits=0, sizes=sizes)
    with pytest.raises(ResourceError, match="even with one integration step per pass"):
        score_to_store(ScoreRequest(out=str(tmp_path / "x.h5"), model=str(tiny_model_dir), data=str(sst2_small),
                                    task="sst2", examples="0:1", options=ScoreOptions(steps=4, group=1), device="cpu"),
                       warn=lambda m: None)
    result = runner.invoke(app, ["score", "--model", str(tiny_model_dir), "--data", str(sst2_small), "--task", "sst2",
                                 "--examples", "0:2", "--steps", "4", "--group", "1", "--out", str(tmp_path / "y.h5"), "-q"])
    assert result.exit_code == 5
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # 3 steps (4, alpha = 1 shared) for each of the 3 layers in one sweep
    assert len(lines) == 2 and lines[0].startswith("Warning: out of memory with 9 integration steps per pass")
    assert lines[1].startswith("Error: out of memory on cpu even with one integration step per pass")
    with Store(tmp_path / "y.h5") as s:
        assert s.indices() == []
    assert sizes[-5:] == [9, 5, 3, 2, 1]  # halved rounding up, then 1, then the end


def test_a_rank_alone_gives_up_with_one_line(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    args = ["score", "--out", str(tmp_path / "s.h5"), "--examples", "0:2", "--steps", "2", "-q", "--dist-timeout", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 6
    assert one_error_line(result) == ("Error: RANK and WORLD_SIZE are set but not MASTER_ADDR and MASTER_PORT (?:?):"
                                      " start attattr with torchrun, or set all four")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    result = runner.invoke(app, args)
    assert result.exit_code == 6
    assert one_error_line(result).startswith(f"Error: rank 0 of 2 could not join the others at 127.0.0.1:{port} (--dist-timeout 1 s)")
    assert not (tmp_path / "s.h5").exists()


def test_provenance_of_hundreds_of_shards_fits_an_hdf5_attribute(tmp_path):
    from attattr_cli.store.merging import _ATTR_LIMIT, _fit_attr, _group_merges, _group_runs

    cmd = ["attattr", "score", "--model", "/very/long/path/" + "x" * 100, "--out", "scores.h5"]
    runs = [{"command": cmd, "kernel": "cuda", "device": f"cuda:{r % 8}", "requested": 40, "to_score": 40,
             "rank": r, "world_size": 512, "host": f"node{r // 8}", "started": f"2026-11-23T10:{r % 60:02d}:00+00:00",
             "shard": f"{r}/512"} for r in range(512)]
    runs.insert(0, {"command": ["attattr", "score"], "kernel": "torch", "requested": 5, "to_score": 5, "started": "x"})
    text = _fit_attr(runs, _group_runs)
    assert len(text) <= _ATTR_LIMIT
    plain, launch = json.loads(text)
    assert plain["requested"] == 5
    assert launch["ranks"] == 512 and launch["requested"] == 512 * 40 and len(launch["hosts"]) == 64
    assert launch["started"] == "2026-11-23T10:00:00+00:00" and len(launch["devices"]) == 8
    small = runs[:3]
    assert json.loads(_fit_attr(small, _group_runs)) == small  # nothing condensed when it fits
    merges = [{"time": "t", "shards": [{"file": f"s.rank{k}-of-1024.h5", "shard": f"{k}/1024", "examples": 40,
                                        "added": 40} for k in range(1024)], "added": 40960, "skipped": 0}]
    assert json.loads(_fit_attr(merges, _group_merges)) == [{"time": "t", "shards": 1024, "added": 40960, "skipped": 0}]
    with h5py.File(tmp_path / "a.h5", "w") as f:  # and HDF5 takes it
        f.attrs["runs"] = text
