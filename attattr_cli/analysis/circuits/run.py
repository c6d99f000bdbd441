"""One circuit evaluation: score heads by each method, draw MIB's curve for each ranking."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import REGISTRY
from ..ablation import PERCENTAGES, curve, ends, keep_masks
from .evaluate import area, bootstrap, check_gap
from .task import Context


@dataclass
class MethodResult:
    name: str
    scores: np.ndarray  # [layer, head], the mean over pairs
    per_pair: np.ndarray  # [pairs, layer, head]
    curve: list  # f(k) for the signed ranking (CPR's)
    curve_abs: list  # f(k) for the absolute ranking (CMD's)
    cpr: float
    cmd: float
    cpr_interval: tuple
    cmd_interval: tuple
    cpu_s_per_pair: float
    spearman: float | None = None  # with exact patching on the pairs the methods saw, where computed
    top10_shared: int | None = None
    completeness: float | None = None  # |sum of scores - (m(N) - m(empty))| / |m(N) - m(empty)|, where it applies


@dataclass
class CircuitRun:
    methods: dict = field(default_factory=dict)
    clean: float = 0.0  # m(N), mean over pairs
    empty: float = 0.0  # m(empty)
    n_pairs: int = 0  # the pairs the curve is measured on
    ablation: str = "patching"
    metric: str = "logit-diff"
    layers: int = 0
    heads: int = 0


def _cpu() -> float:
    return time.process_time()


def evaluate(ctx: Context, methods, bootstrap_samples: int = 1000, fit: Context | None = None) -> CircuitRun:
    """Score heads by each method on ``fit``'s pairs (default: ``ctx``'s own) and measure each
    ranking's curve on ``ctx``'s pairs: with a split (MIB's protocol) no method, and no choice a
    method makes, sees the pairs it is judged on."""
    from scipy.stats import spearmanr

    fit = ctx if fit is None else fit
    task = ctx.task
    run = CircuitRun(n_pairs=task.n, ablation=ctx.ablation, metric=task.metric_name,
                     layers=task.layers, heads=task.heads)
    t = _cpu()
    for c in ([ctx] if fit is ctx else [fit, ctx]):  # the ablation's sources, shared by every method (not charged to any)
        for b in c.task.batches:
            c.source(b)
    clean, empty = ends(ctx)
    check_gap(clean, empty, ctx.ablation)  # a gap within noise: the ratio f is undefined
    run.clean, run.empty = float(clean.mean()), float(empty.mean())
    shared = (_cpu() - t) / fit.task.n
    for name in methods:
        method = REGISTRY[name]
        t = _cpu()
        per = np.asarray(method.compute(fit), dtype=np.float64)
        cost = (_cpu() - t) / fit.task.n + (shared if method.kind != "baseline" else 0.0)  # a baseline runs no model
        mean = per.mean(0)
        pm, f = curve(ctx, np.concatenate([keep_masks(mean, False), keep_masks(mean, True)]))  # signed, absolute
        k = len(PERCENTAGES)
        cpr, cmd = area(PERCENTAGES, f[:k])[0], area(PERCENTAGES, f[k:])[1]
        ci_cpr, ci_cmd = bootstrap(pm[:k], pm[k:], clean, empty, samples=bootstrap_samples, seed=ctx.seed)
        res = MethodResult(name, mean, per, f[:k].tolist(), f[k:].tolist(), cpr, cmd, ci_cpr, ci_cmd, cost)
        if method.complete:  # on the pairs the method saw
            total = per.sum((1, 2))
            gap = np.subtract(*ends(fit))
            res.completeness = float(np.abs(total - gap).mean() / max(np.abs(gap).mean(), 1e-12))
        run.methods[name] = res
    ref = run.methods.get("patching")
    if ref is not None:
        for r in run.methods.values():
            r.spearman = float(spearmanr(r.scores.ravel(), ref.scores.ravel())[0])
            top = lambda s: set(np.argsort(-s.ravel())[:10].tolist())  # noqa: E731
            r.top10_shared = len(top(r.scores) & top(ref.scores))
    return run
