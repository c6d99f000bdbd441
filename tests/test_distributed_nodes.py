"""Two "machines" (two torchrun agents, --nnodes 2, each in its own folder as if on its own
disk): rank 0 merges what it sees, names the other shard, and `attattr merge` finishes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

from typer.testing import CliRunner

from attattr_cli.cli import app
from test_distributed import STEPS, assert_same_examples
from torchrun_util import ROOT

N = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_machines_without_a_shared_disk(tmp_path, single):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    port = _free_port()
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    procs = []
    for k, cwd in enumerate(nodes):
        cwd.mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={k}", "--nproc-per-node=1",
             f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "attattr_cli", "score", "--out", "s.h5",
             "--examples", f"0:{N}", "--steps", str(STEPS), "-q"],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=150) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert outs[0][0].strip() == "s.h5" and outs[1][0].strip() == ""
    err0 = outs[0][1]
    assert (f"scored {N} examples on 2 processes (0 already in the shards, 0 already in s.h5)") in err0
    assert ("1 shard is not on this machine (s.rank1-of-2.h5: other machines wrote it to their own disks):"
            " copy it here and run: attattr merge s.rank0-of-2.h5 s.rank1-of-2.h5 --out s.h5") in err0
    assert (nodes[0] / "s.rank0-of-2.h5").exists() and (nodes[1] / "s.rank1-of-2.h5").exists()

    runner = CliRunner()
    shards = [nodes[0] / "s.rank0-of-2.h5", nodes[0] / "s.rank1-of-2.h5"]
    # before the copy: rank 1's shard is missing
    refused = runner.invoke(app, ["merge", str(shards[0]), "--out", str(nodes[0] / "s.h5")])
    assert refused.exit_code == 4 and "the shards of rank 1 of 2 are missing" in refused.stderr
    shutil.copy(nodes[1] / "s.rank1-of-2.h5", shards[1])
    merged = runner.invoke(app, ["merge", *map(str, shards), "--out", str(nodes[0] / "s.h5")])
    assert merged.exit_code == 0, merged.output
    assert_same_examples(nodes[0] / "s.h5", single, list(range(N)))
