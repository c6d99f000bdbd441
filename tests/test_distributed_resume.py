"""A torchrun rank killed midway (SIGKILL) and restarted resumes its shard."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attattr_cli.engine import distributed
from attattr_cli.store import Store
from attattr_cli.store.schema import SHARD_EXAMPLES
from test_distributed import STEPS, assert_same_examples
from torchrun_util import torchrun

HELPER = Path(__file__).with_name("torchrun_kill.py")
N = 40  # the examples of conftest's `single` store
KILL_AFTER = 5


def _scored(log: Path, rank: int) -> list[int]:
    path = log / f"scored.rank{rank}.txt"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _score_args(out: str) -> list:
    # one example per pass (--group 1): the log then names exactly the examples computed before the kill
    return [HELPER, "score", "--out", out, "--examples", f"0:{N}", "--steps", STEPS, "--group", "1", "-q"]


def test_killed_rank_restarted_by_hand_resumes_its_shard(tmp_path, single):
    first, second = tmp_path / "log1", tmp_path / "log2"
    first.mkdir()
    second.mkdir()
    killed = torchrun(*_score_args("s.h5"), cwd=tmp_path, env={
        "ATTATTR_TEST_KILL_RANK": "1", "ATTATTR_TEST_KILL_AFTER": str(KILL_AFTER), "ATTATTR_TEST_LOG": str(first)})
    assert killed.returncode != 0
    assert not (tmp_path / "s.h5").exists()  # nothing merged
    shard1 = distributed.shard_path(tmp_path / "s.h5", 1, 2)
    with Store(shard1) as s:  # readable after SIGKILL, holding what was written before it
        kept1 = s.indices()
        assigned1 = [int(i) for i in s.f[SHARD_EXAMPLES][()]]
        for i in kept1:
            assert s.get(i).attribution.shape[0] == 3
    assert len(kept1) == KILL_AFTER and set(kept1) < set(assigned1)
    assert kept1 == _scored(first, 1)  # the killed rank died right after writing its 5th example
    shard0 = distributed.shard_path(tmp_path / "s.h5", 0, 2)
    with Store(shard0) as s:
        kept0 = s.indices()

    again = torchrun(*_score_args("s.h5"), cwd=tmp_path, env={"ATTATTR_TEST_LOG": str(second)})
    assert again.returncode == 0, again.stderr[-3000:]
    kept = len(kept0) + len(kept1)
    assert f"scored {N - kept} example{'s' if N - kept != 1 else ''} on 2 processes ({kept} already in the shards, 0 already in s.h5)" in again.stderr
    # the restarted rank computed only what its shard lacked: no example twice
    assert sorted(_scored(second, 1)) == sorted(set(assigned1) - set(kept1))
    assert not set(_scored(second, 0)) & set(kept0)
    assert_same_examples(tmp_path / "s.h5", single, list(range(N)))
    assert not shard0.exists() and not shard1.exists()
    with Store(tmp_path / "s.h5") as s:
        runs = s.provenance["runs"]
    rank1 = [r for r in runs if r["rank"] == 1]
    assert [(r["requested"], r["to_score"]) for r in rank1] == [
        (len(assigned1), len(assigned1)), (len(assigned1), len(assigned1) - KILL_AFTER)]


def test_killed_rank_restarted_by_torchrun_resumes_its_shard(tmp_path, single):
    log = tmp_path / "log"
    log.mkdir()
    marker = tmp_path / "killed.txt"
    result = torchrun("--max-restarts=1", *_score_args("s.h5"), cwd=tmp_path, env={
        "ATTATTR_TEST_KILL_RANK": "1", "ATTATTR_TEST_KILL_AFTER": str(KILL_AFTER),
        "ATTATTR_TEST_KILL_ONCE": str(marker), "ATTATTR_TEST_LOG": str(log)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.read_text() == f"rank 1 killed after {KILL_AFTER} examples\n"
    scored1 = _scored(log, 1)
    assert len(scored1) == len(set(scored1)) > KILL_AFTER  # resumed, nothing scored twice
    found = re.search(r"scored (\d+) examples? on 2 processes \((\d+) already in the shards, 0 already in s.h5\)",
                      result.stderr)
    assert found and int(found.group(1)) + int(found.group(2)) == N and int(found.group(2)) >= KILL_AFTER
    assert_same_examples(tmp_path / "s.h5", single, list(range(N)))
    with Store(tmp_path / "s.h5") as s:
        runs = s.provenance["runs"]
    (a1, b1) = [(r["requested"], r["to_score"]) for r in runs if r["rank"] == 1]
    assert a1 == (len(scored1), len(scored1)) and b1 == (len(scored1), len(scored1) - KILL_AFTER)
