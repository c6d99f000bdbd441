"""`score` on 1 process vs 2 torchrun processes (CPU, gloo), from one run on this machine.

The built-in default (synthetic task, its 3-layer BERT), the first N held-out examples,
m = 20 steps, one thread per process. Prints the token imbalance of the 2-process split,
the speed ratio (scoring time as each run reports it, and wall time with start-up), and
whether the merged store equals the one-process store example for example.

With fewer than 2 free cores the ratio says more about the machine than about attattr.

Run: `just bench-distributed` (or python bench/bench_distributed.py [--examples N] [--steps M] [--nproc P]).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attattr_cli.engine import distributed  # noqa: E402
from attattr_cli.store import Store  # noqa: E402


def run(cmd: list[str], cwd: Path) -> tuple[float, float, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    scoring = float(re.search(r" in (\d+\.\d+) s", done.stderr).group(1))
    return wall, scoring, done.stderr


def same(a: Path, b: Path) -> tuple[bool, float]:
    worst = 0.0
    with Store(a) as x, Store(b) as y:
        if x.indices() != y.indices():
            return False, float("inf")
        for i in x.indices():
            ea, eb = x.get(i), y.get(i)
            if ea.tokens != eb.tokens or ea.pred != eb.pred:
                return False, float("inf")
            worst = max(worst, float(np.abs(ea.attribution - eb.attribution).max()))
    return worst <= 1e-5, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", help="a model folder (default: the built-in default)")
    ap.add_argument("--data", help="a data file (default: the built-in synthetic held-out set)")
    ap.add_argument("--task", help="the data's task preset, e.g. sst2")
    args = ap.parse_args()
    common = ["score", "--examples", f"0:{args.examples}", "--steps", str(args.steps), "--device", "cpu", "-q"]
    for name in ("model", "data", "task"):
        if getattr(args, name):
            common += [f"--{name}", getattr(args, name)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wall1, score1, _ = run([sys.executable, "-m", "attattr_cli", *common, "--out", "one.h5"], tmp)
        wall2, score2, err = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={args.nproc}", "-m", "attattr_cli", *common, "--out", "many.h5"], tmp)
        ok, worst = same(tmp / "one.h5", tmp / "many.h5")
        with Store(tmp / "one.h5") as st:
            lengths = {i: len(st.get(i, arrays=False).tokens) for i in st.indices()}
    tokens = re.search(r"tokens per process ([\d, ]+) \(imbalance (\d+\.\d+)\)", err)
    print(f"examples {args.examples}, steps {args.steps}, {args.model or 'built-in default model'}, CPU, 1 thread per process, "
          f"{os.cpu_count()} cores")
    order = sorted(lengths)
    size = -(-len(order) // args.nproc)
    by_count = [order[k * size:(k + 1) * size] for k in range(args.nproc)]  # contiguous, equal example counts
    print(f"tokens per process ({args.nproc}): {tokens.group(1)}; token imbalance {tokens.group(2)} "
          f"(equal example counts in contiguous blocks would give {distributed.imbalance(lengths, by_count):.4f})")
    print(f"1 process:  scoring {score1:.1f} s, wall {wall1:.1f} s")
    print(f"{args.nproc} processes: scoring and merging {score2:.1f} s, wall {wall2:.1f} s")
    print(f"speed ratio {score1 / score2:.2f}x (scoring), {wall1 / wall2:.2f}x (wall, start-up included)")
    print(f"merged == one-process, example for example: {'yes' if ok else 'NO'} (max |difference| {worst:.1e})")


if __name__ == "__main__":
    main()
