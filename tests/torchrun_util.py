"""Launching attattr under torchrun from tests: 2 CPU processes on this machine (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(*args, nproc: int = 2, cwd: Path, env: dict | None = None, timeout: float = 150,
             launcher: tuple = ()) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node NPROC [launcher...] ARGS`` in ``cwd``."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env["OMP_NUM_THREADS"] = "1"
    full_env.pop("RANK", None)
    full_env.pop("WORLD_SIZE", None)
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *launcher, *[str(a) for a in args]]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
