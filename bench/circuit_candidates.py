"""How the recommended circuit ranking's rule was chosen: candidate rankings built from the
estimates of the pairs the methods see (the fit half), each judged on the other half.

For each task (SmolLM2, ``--pairs`` pairs of ``--seed``, split in half): verified AtP's
interleavings (negative scores times c, for each c in ``verified.SCALES``), the one
``atp-verified`` picks on the fit pairs, ``attr-tiers``, plain AtP; per candidate the CMD and CPR
on the eval pairs, and the Spearman correlation with exact patching on the fit pairs (the
estimate of the method's own pairs) and on the eval pairs (with ``--eval-patching``: does the
ranking carry over to pairs it never saw). Run on tuning pair sets only while a rule is being
chosen; held-out sets go through bench_circuits.py once the rule is fixed.

    OMP_NUM_THREADS=1 python bench/circuit_candidates.py --smollm2 DIR --tasks ioi,capitals --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attattr_cli.analysis import ablation as measure  # noqa: E402
from attattr_cli.analysis.circuits import REGISTRY, tiers, verified  # noqa: E402
from attattr_cli.analysis.circuits.evaluate import area  # noqa: E402
from attattr_cli.analysis.circuits.split import split_pairs  # noqa: E402
from attattr_cli.analysis.circuits.task import CircuitTask, Context  # noqa: E402
from attattr_cli.data import pair_tasks  # noqa: E402


def judge(ctx, scores):
    clean, empty = measure.ends(ctx)
    f_s = measure.curve_from(measure.per_pair_metrics(ctx, measure.keep_masks(scores, False)), clean, empty)
    f_a = measure.curve_from(measure.per_pair_metrics(ctx, measure.keep_masks(scores, True)), clean, empty)
    return area(measure.PERCENTAGES, f_s)[0], area(measure.PERCENTAGES, f_a)[1], f_a


def main() -> None:
    from scipy.stats import spearmanr

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", default=os.environ.get("ATTATTR_SMOLLM2"))
    ap.add_argument("--tasks", default="ioi,capitals")
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-patching", action="store_true", help="exact patching on the eval pairs too")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from attattr_cli.models.loading import load

    loaded = load(args.smollm2, device="cpu", dtype="float32", lm=True)
    for p in loaded.model.parameters():
        p.requires_grad_(False)
    out = []
    for task in args.tasks.split(","):
        t0 = time.time()
        pairs = pair_tasks.generate(task, loaded.tokenizer, args.pairs, seed=args.seed)
        parts = split_pairs(len(pairs), "half", args.seed)
        fit = Context(CircuitTask(loaded, [pairs[i] for i in parts.fit]))
        ev = Context(CircuitTask(loaded, [pairs[i] for i in parts.eval]))
        ig, atp, inner = tiers.verified_estimates(fit)
        exact_fit = REGISTRY["patching"].compute(fit).mean(0)
        exact_eval = REGISTRY["patching"].compute(ev).mean(0) if args.eval_patching else None
        cands = {f"verified c={c:g}": verified.interleaved(inner, c) for c in verified.SCALES}
        chosen = list(cands)[fit.choose(list(cands.values()), verified.CHECKED)]
        cands["attr-tiers"] = REGISTRY["attr-tiers"].compute(fit)[0]
        cands["atp"] = atp
        cands["attr-gates"] = ig
        cands["exact (fit pairs)"] = exact_fit
        print(f"\n{task} seed {args.seed}: {parts.describe()}; atp-verified picks {chosen} on the fit pairs")
        print(f"{'candidate':<20}{'CPR':>7}{'CMD':>7}{'Sp fit':>8}{'Sp eval':>8}  f(k) absolute")
        rows = {}
        for name, s in cands.items():
            cpr, cmd, f_a = judge(ev, s)
            sp_fit = float(spearmanr(s.ravel(), exact_fit.ravel())[0])
            sp_eval = None if exact_eval is None else float(spearmanr(s.ravel(), exact_eval.ravel())[0])
            rows[name] = {"cpr": cpr, "cmd": cmd, "spearman_fit": sp_fit, "spearman_eval": sp_eval}
            print(f"{name:<20}{cpr:>7.3f}{cmd:>7.3f}{sp_fit:>8.3f}{'' if sp_eval is None else f'{sp_eval:8.3f}':>8}  "
                  + " ".join(f"{x:.2f}" for x in f_a))
        print(f"({time.time() - t0:.0f} s wall)")
        out.append({"task": task, "seed": args.seed, "split": parts.to_dict(), "chosen": chosen, "rows": rows})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
