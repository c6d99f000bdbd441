"""`faithfulness --methods all` against the default method set: CPU time, from one run on
this machine.

One store is scored once (the built-in default, or --model/--data/--task), then copied twice;
`evaluate_store` runs on one copy with the default methods and on the other with all
methods (token importance computed afresh in both, the same metrics, no permutation test
unless --permutations; the default set without the masking protocol, as the first release
ran it, all methods with it), each timed by the process's CPU time (time.process_time, one
thread). Prints both times, the ratio, and the CPU time each method took alone.

Run: python bench/bench_faithfulness_methods.py [--examples 0:200] [--model M --data D --task T] [--steps 10]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from attattr_cli.analysis import faithfulness as fa  # noqa: E402
from attattr_cli.analysis import methods as registry  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", default="0:200")
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--task")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--permutations", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import attattr_cli as aa_pkg  # noqa: F401
    from attattr_cli import api

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.h5"
        api.score(args.model, data=args.data, task=args.task, examples=args.examples, out=base, steps=args.steps,
                  device="cpu")
        times = {}
        per_method = {}
        # the default set with the metrics of the first release (no masking protocol), then
        # every method with every metric
        for name, methods, masks in (("default", list(registry.DEFAULT), ()), ("all", ["all"], fa.MASK_FRACTIONS)):
            copy = Path(tmp) / f"{name}.h5"
            shutil.copy(base, copy)
            opts = fa.FaithfulnessOptions(methods=methods, permutations=args.permutations,
                                          perm_layers=None if args.permutations else [], mask_fractions=masks)
            t0 = time.process_time()
            report = fa.evaluate_store(copy, opts, model=args.model, device="cpu", keep=True)
            times[name] = time.process_time() - t0
            print(f"{name}: {len(report['methods'])} methods, {report['examples']} examples, "
                  f"{report['forwards']} forward passes, {times[name]:.1f} s CPU", flush=True)
        # each added method alone (token importance only), on a fresh copy
        for m in registry.NAMES:
            if m in registry.DEFAULT:
                continue
            copy = Path(tmp) / f"{m}.h5"
            shutil.copy(base, copy)
            t0 = time.process_time()
            fa.evaluate_store(copy, fa.FaithfulnessOptions(methods=[m], permutations=0, perm_layers=[], mask_fractions=()),
                              model=args.model, device="cpu", keep=True)
            per_method[m] = time.process_time() - t0
    print(f"ratio all / default: {times['all'] / times['default']:.2f}")
    print("one added method with loo and grad (its metrics without the masking protocol): "
          + ", ".join(f"{m} {t:.1f} s" for m, t in per_method.items()))


if __name__ == "__main__":
    main()
