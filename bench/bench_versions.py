"""SmolLM2 scored by this checkout and by another version of attattr, alternately, in one run.

The issue's goal for SmolLM2 ("twice less CPU than the version it was set against") needs both
versions timed on the same machine at the same time: this bench scores the prompt "The capital
of France is" with target " Paris" (every layer, the default --tol 0.1, one thread) with the
attattr_cli of this checkout and with that of --old (a source folder, e.g. a git worktree:
`git worktree add /tmp/attattr-old 9d7a9d4`), each in its own process, --pairs times
alternating, and prints each run's CPU seconds (three scorings after loading, process time),
nodes and layer 0's nodes, then the ratio of the medians.

Run: python bench/bench_versions.py --smollm2 DIR --old /tmp/attattr-old
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
import attattr_cli
from attattr_cli.engine.run import ScoreRequest, prepare_run
from attattr_cli.engine.options import ScoreOptions
req = ScoreRequest(out="unused.h5", model=sys.argv[1], prompts=["The capital of France is"], command=["bench"],
                   options=ScoreOptions(lm=True, target_token=" Paris", tol=0.1))
run = prepare_run(req, None)
e = run.picked[0]
times = []
for _ in range(3):
    c = time.process_time()
    r = run.scorer.score(e, run.encoded[e.index])
    times.append(time.process_time() - c)
fam = r.families["self"]
print(json.dumps({"cpu": times, "nodes": int(fam.nodes.sum()), "layer0": int(fam.nodes[0]),
                  "capped": int(fam.capped.sum()), "source": attattr_cli.__file__}))
"""


def one(source: Path, model: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(source), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, model], env=env, cwd=source, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"the run from {source} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", default=os.environ.get("ATTATTR_SMOLLM2"), help="SmolLM2-135M-Instruct model folder")
    ap.add_argument("--old", required=True, help="source folder of the other version (holds attattr_cli/)")
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    if not args.smollm2 or not Path(args.smollm2).is_dir():
        sys.exit("bench_versions needs the SmolLM2 folder: --smollm2 DIR or ATTATTR_SMOLLM2")
    old = Path(args.old).resolve()
    if not (old / "attattr_cli").is_dir():
        sys.exit(f"{old} holds no attattr_cli/")
    medians = {"old": [], "this": []}
    for _ in range(args.pairs):
        for name, source in (("old", old), ("this", ROOT)):
            r = one(source, args.smollm2)
            medians[name].append(statistics.median(r["cpu"]))
            print(f"{name:<4} ({source}): CPU s {', '.join(f'{t:.2f}' for t in r['cpu'])}; nodes {r['nodes']}, "
                  f"layer 0 {r['layer0']}, layers at the cap {r['capped']}", flush=True)
    a, b = statistics.median(medians["old"]), statistics.median(medians["this"])
    print(f"median CPU s: old {a:.2f}, this {b:.2f}: {a / b:.2f}x less CPU "
          f"(pairs: {', '.join(f'{x / y:.2f}x' for x, y in zip(medians['old'], medians['this']))})")


if __name__ == "__main__":
    main()
