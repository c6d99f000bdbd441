"""`faithfulness` CPU time, from one run on this machine: batched passes against one
sequence per pass, and `--methods all` against the default method set.

One store is scored once (the built-in default, or --model/--data/--task), then copied for
every measurement (token importance computed afresh each time), and every measurement is
timed by the process's CPU time (time.process_time, one thread), the model loaded once.

1. Batched passes (`--methods attr,attention_last,grad,random`, the command's defaults:
   the masking protocol, 20 permutations in every layer), the same store three ways:
   one sequence per forward pass (batch_examples=0, max_tokens=1: the analysis at batch 1),
   each metric's inputs of one example in their own passes grouped by length
   (batch_examples=0: how the first releases ran), and the inputs of 16 examples sharing
   passes (the default). Prints CPU per example, forward passes per example, the ratios,
   and the largest difference of any per-example number from the batch-1 run.
2. `--methods all` against the default set (no permutation test unless --permutations;
   the default set without the masking protocol, as the first release ran it, all methods
   with it), and the CPU time each added method took alone.

Run: python bench/bench_faithfulness_methods.py [--examples 0:200] [--model M --data D --task T] [--steps 10]
     [--part batching|methods|all]
"""

from __future__ import annotations

import argparse
import math
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


def _leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def batching(base: Path, tmp: str, loaded, model) -> None:
    """One sequence per pass, per-metric passes, shared passes: CPU per example."""
    from attattr_cli.analysis import token_importance as ti

    passes = {"n": 0}
    forward = loaded.model.forward

    def counted(*a, **k):
        passes["n"] += 1
        return forward(*a, **k)

    loaded.model.forward = counted
    ways = (("one sequence per pass", 0, 1), ("per-metric passes", 0, ti.MAX_TOKENS),
            (f"{fa.BATCH_EXAMPLES} examples per pass", fa.BATCH_EXAMPLES, ti.MAX_TOKENS))
    cpu, reports = {}, {}
    for name, be, mt in ways:
        copy = Path(tmp) / f"batching-{be}-{mt}.h5"
        shutil.copy(base, copy)
        opts = fa.FaithfulnessOptions(methods=["attr", "attention_last", "grad", "random"])
        passes["n"] = 0
        t0 = time.process_time()
        report = fa.evaluate_store(copy, opts, model=model, device="cpu", loaded=loaded, batch_examples=be, keep=True,
                                   max_tokens=mt)
        cpu[name] = (time.process_time() - t0) / report["examples"]
        reports[name] = report
        print(f"{name}: {cpu[name] * 1e3:.1f} ms CPU per example, {passes['n'] / report['examples']:.1f} forward "
              f"passes per example ({report['forwards'] / report['examples']:.0f} sequences), "
              f"{report['examples']} examples", flush=True)
    loaded.model.forward = forward
    first, *rest = [w[0] for w in ways]
    ref = dict(_leaves(reports[first]["per_example"]))
    for name in rest:
        got = dict(_leaves(reports[name]["per_example"]))
        diff = max((abs(got[k] - v) for k, v in ref.items()
                    if isinstance(v, float) and isinstance(got[k], float) and math.isfinite(v)), default=0.0)
        print(f"{first} / {name}: {cpu[first] / cpu[name]:.2f}x CPU; largest difference of a per-example number "
              f"{diff:.1e}")
    print(f"per-metric passes / {rest[-1]}: {cpu[rest[0]] / cpu[rest[-1]]:.2f}x CPU")


def methods(base: Path, tmp: str, args, loaded) -> None:
    times = {}
    per_method = {}
    # the default set with the metrics of the first release (no masking protocol), then
    # every method with every metric
    for name, meths, masks in (("default", list(registry.DEFAULT), ()), ("all", ["all"], fa.MASK_FRACTIONS)):
        copy = Path(tmp) / f"{name}.h5"
        shutil.copy(base, copy)
        opts = fa.FaithfulnessOptions(methods=meths, permutations=args.permutations,
                                      perm_layers=None if args.permutations else [], mask_fractions=masks)
        t0 = time.process_time()
        report = fa.evaluate_store(copy, opts, model=args.model, device="cpu", loaded=loaded, keep=True)
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
        fa.evaluate_store(copy, fa.FaithfulnessOptions(methods=[m], permutations=0, perm_layers=[], mask_fractions=()), keep=True,
                          model=args.model, device="cpu", loaded=loaded)
        per_method[m] = time.process_time() - t0
    print(f"ratio all / default: {times['all'] / times['default']:.2f}")
    print("one added method with loo and grad (its metrics without the masking protocol): "
          + ", ".join(f"{m} {t:.1f} s" for m, t in per_method.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", default="0:200")
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--task")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--permutations", type=int, default=0)
    ap.add_argument("--part", choices=("batching", "methods", "all"), default="all")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import attattr_cli as aa_pkg  # noqa: F401
    from attattr_cli import api

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.h5"
        api.score(args.model, data=args.data, task=args.task, examples=args.examples, out=base,
                  integration=api.Integration(steps=args.steps), compute=api.Compute(device="cpu"))
        from attattr_cli.store import TokenImportanceStore

        with TokenImportanceStore(base) as store:
            loaded = fa.load_for_store(store, args.model, "cpu")
        if args.part in ("batching", "all"):
            batching(base, tmp, loaded, args.model)
        if args.part in ("methods", "all"):
            methods(base, tmp, args, loaded)


if __name__ == "__main__":
    main()
