"""`attattr` for torchrun in tests, with two hooks set by environment variables.

torchrun --standalone --nproc-per-node 2 tests/torchrun_kill.py score --out s.h5 ...

- ATTATTR_TEST_KILL_RANK=k and ATTATTR_TEST_KILL_AFTER=m: rank k SIGKILLs itself right
  after writing its m-th example into its shard (no cleanup, like a machine that dies).
  With ATTATTR_TEST_KILL_ONCE=FILE it does so only if FILE does not exist yet, and creates
  it, so that a run restarted by torchrun (--max-restarts) goes through.
- ATTATTR_TEST_LOG=DIR: each rank appends the index of every example it scores to
  DIR/scored.rank{k}.txt, so a test can tell what a restarted rank recomputed.

The engine has no test hooks: this script wraps its functions before calling the CLI.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from attattr_cli.engine.scorer import Scorer
from attattr_cli.store import StoreWriter

RANK = int(os.environ.get("RANK", "0"))
KILL_RANK = os.environ.get("ATTATTR_TEST_KILL_RANK")
KILL_AFTER = int(os.environ.get("ATTATTR_TEST_KILL_AFTER", "0"))
KILL_ONCE = os.environ.get("ATTATTR_TEST_KILL_ONCE")
LOG = os.environ.get("ATTATTR_TEST_LOG")

if KILL_RANK is not None and int(KILL_RANK) == RANK and not (KILL_ONCE and Path(KILL_ONCE).exists()):
    write = StoreWriter.write
    written = {"n": 0}

    def write_then_die(self, score):
        write(self, score)
        written["n"] += 1
        if written["n"] >= KILL_AFTER:
            if KILL_ONCE:
                Path(KILL_ONCE).write_text(f"rank {RANK} killed after {written['n']} examples\n")
            os.kill(os.getpid(), signal.SIGKILL)

    StoreWriter.write = write_then_die

if LOG:
    score = Scorer.score

    def logged(self, example, *args, **kwargs):
        with open(Path(LOG) / f"scored.rank{RANK}.txt", "a") as f:
            f.write(f"{example.index}\n")
        return score(self, example, *args, **kwargs)

    Scorer.score = logged

if __name__ == "__main__":
    from attattr_cli.cli import main

    main()
