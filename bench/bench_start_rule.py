"""The three-node start's acceptance against the true error, on examples held out from bench_score.py.

Every example-layer is scored with its path ended at the three-node start (alpha = 0, 1/2 and
the free 1: Simpson's rule), whatever its estimate says, and the map compared with a
Gauss-Legendre reference (--ref-steps nodes). For each way of estimating Simpson's error it
prints, at each tolerance T, the share of example-layers the start would end (estimate <= T
and the completeness residual agreeing, as the engine judges it), the largest true error among
them, how many of them are off by more than T and by more than 2 x T, and how often the
estimate is at least the true error there:

  midpoint       max |Attr(Simpson - midpoint)|: the midpoint rule's error (before this bench)
  scaled         the same times adaptive.start_factor: min(1, max(8 q, 1/2)), q the ratio of
                 Simpson's to the midpoint rule's completeness residual on dF/dalpha (the engine)
  scaled x1/2    midpoint x 1/2 alone, and x8 q without the floor: what the floor and the ratio
  8q no floor    each guard against

Models: --model default (the built-in NLI model on 300 synthetic examples generated with another
seed than the built-in held-out set), minilm (bench_score.py's MiniLM with a seeded random head,
SST-2 dev sentences 100..399: bench_score.py uses 0..19), gemma3 (bench_integration.py's random
Gemma-3 decoder, SST-2 dev 100..299). One thread; the MiniLM run takes about 12 CPU minutes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_integration import minilm_random_head, random_gemma3  # noqa: E402

from attattr_cli.engine import adaptive, grouped, layer_integral, scorer as scorer_mod  # noqa: E402
from attattr_cli.engine.options import ScoreOptions  # noqa: E402
from attattr_cli.engine.run import ScoreRequest, prepare_run  # noqa: E402

SST2 = str(ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("default", "minilm", "gemma3"), default="default")
    ap.add_argument("--examples", default=None, help="example range (default: per model, above)")
    ap.add_argument("--data", default=None, help="data file (default: per model, above)")
    ap.add_argument("--ref-steps", type=int, default=None, help="Gauss-Legendre reference nodes (64 MiniLM, else 128)")
    ap.add_argument("--tols", default="0.1,0.2,0.5")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model, task = None, "sst2"
    if args.model == "default":
        from attattr_cli.data import synthetic

        task = "synthetic"
        if args.data is None:
            args.data = str(Path(tempfile.mkdtemp(prefix="attattr-start-")) / "heldout.tsv")
            synthetic.write(args.data, synthetic.generate(300, 4242))
        args.examples = args.examples or "0:300"
    elif args.model == "minilm":
        model, args.examples = minilm_random_head(), args.examples or "100:400"
    else:
        model, args.examples = random_gemma3(), args.examples or "100:300"
    args.data = args.data or SST2
    ref_steps = args.ref_steps or (64 if args.model == "minilm" else 128)
    log = forced_start()

    def prep(options, loaded):
        req = ScoreRequest(out="unused.h5", model=model, data=args.data, task=task, examples=args.examples,
                           options=options, command=["bench"])
        return prepare_run(req, loaded)

    reference = prep(ScoreOptions(rule="gauss", steps=ref_steps), None)
    run = prep(ScoreOptions(tol=0.1), reference.loaded)
    refs, got = scored(reference), scored(run)
    rows = []
    for e in run.picked:
        r, ref = got[e.index], refs[e.index]
        for k, layer in enumerate(r.layers):
            want = ref.attribution[k].astype(np.float64)
            err = float(np.abs(r.attribution[k].astype(np.float64) - want).max() / np.abs(want).max())
            rows.append({**log[(e.index, int(layer))], "err": err, "layer": int(layer)})
    lengths = [len(run.encoded[e.index].input_ids) for e in run.picked]
    print(f"model: {args.model} ({run.loaded.arch.num_layers} layers), {len(run.picked)} examples ({args.examples}),"
          f" {min(lengths)}..{max(lengths)} tokens, {len(rows)} example-layers; reference gauss m={ref_steps}")
    report(rows, [float(t) for t in args.tols.split(",")])


def forced_start() -> dict:
    """Make every integral start from three nodes and end there, recording per (example, layer)
    what the start's acceptance reads."""
    ctx, log = {}, {}
    group_tol, score, single_tol = (grouped._Group.integrate, scorer_mod.Scorer.score,
                                    layer_integral.Integration.integrate)

    def group_wrap(self, site, *a, **k):
        ctx["ex"], ctx["layer"] = [e.index for e in self.examples], site[1]
        return group_tol(self, site, *a, **k)

    def score_wrap(self, example, *a, **k):
        ctx["ex"] = [example.index]
        return score(self, example, *a, **k)

    def single_wrap(self, enc, site, *a, **k):
        ctx["layer"] = site[1]
        return single_tol(self, enc, site, *a, **k)

    def step(self, i, total, big):
        row, leaf = self.rows[i], self.rows[i].leaves[0]
        effect = row.f[adaptive.ONE] - row.f[adaptive.ZERO]
        f_scale = abs(row.f[adaptive.ONE]) + abs(row.f[adaptive.ZERO])
        scale = adaptive.residual_scale(effect, big)
        log[(ctx["ex"][i], ctx["layer"])] = dict(
            midpoint=adaptive.relative(leaf.e, big), simpson_residual=leaf.rho, midpoint_residual=row.s[0.5] - effect,
            noise=adaptive.FLOOR * (self.eps_f * f_scale + self.eps_acc * scale),
            residual_ok={t: adaptive.residual_ok(leaf.rho, scale, f_scale, t, self.eps_f, self.eps_acc)
                         for t in (0.05, 0.1, 0.2, 0.5, 1.0)})
        return self._finish(i, total, adaptive.relative(leaf.e, big), leaf.rho, adaptive.CONVERGED, False)

    grouped._Group.integrate = group_wrap
    scorer_mod.Scorer.score = score_wrap
    layer_integral.Integration.integrate = single_wrap
    adaptive.coarse_start = lambda tokens, shared: True
    adaptive.Refinement._step = step
    return log


def scored(run) -> dict:
    out = {}
    for group in grouped.plan_groups(run.picked, run.encoded, grouped.group_size(run.scorer)):
        for e, r in zip(group, grouped.score_group(run.scorer, group, [run.encoded[e.index] for e in group])):
            out[e.index] = r
    return out


def report(rows: list, tols: list) -> None:
    err = np.array([r["err"] for r in rows])
    mid = np.array([r["midpoint"] for r in rows])
    ratio = np.abs([r["simpson_residual"] for r in rows]) / np.maximum(np.abs([r["midpoint_residual"] for r in rows]),
                                                                      1e-300)
    estimates = {
        "midpoint": mid,
        "scaled": mid * np.array([adaptive.start_factor(r["simpson_residual"], r["midpoint_residual"], r["noise"])
                                  for r in rows]),
        "scaled x1/2": mid * 0.5,
        "8q no floor": mid * np.minimum(1.0, adaptive.START_RATIO * ratio),
    }
    q = np.quantile(err / np.maximum(mid, 1e-300), [0.5, 0.9, 0.99, 1.0])
    print(f"true error of Simpson's map / the midpoint estimate: median {q[0]:.3f}, 90 % {q[1]:.3f}, 99 % {q[2]:.3f},"
          f" max {q[3]:.3f}")
    layers = np.array([r["layer"] for r in rows])
    for name in ("midpoint", "scaled"):
        ended = (estimates[name] <= tols[0]) & np.array([r["residual_ok"][tols[0]] for r in rows])
        print(f"ended at T = {tols[0]:g} by layer, {name}: " + ", ".join(
            f"{layer}: {ended[layers == layer].mean():.0%}" for layer in sorted(set(layers.tolist()))))
    print(f"{'estimate':<13} {'T':>5} {'ended':>6} {'max err':>8} {'> T':>4} {'> 2T':>4} {'est>=err':>8}")
    for name, est in estimates.items():
        for t in tols:
            ok = np.array([r["residual_ok"][t] for r in rows])
            ended = (est <= t) & ok
            e = err[ended]
            print(f"{name:<13} {t:5g} {ended.mean():6.1%} {e.max() if len(e) else 0:8.2e} {int((e > t).sum()):4d}"
                  f" {int((e > 2 * t).sum()):4d} {(est[ended] >= e).mean() if len(e) else 1:8.1%}", flush=True)


if __name__ == "__main__":
    main()
