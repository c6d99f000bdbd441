"""MIB's faithfulness curve at node level (Mueller et al. 2025, circuit track).

For a ranking of the N heads and each k in ``PERCENTAGES``, keep the top ``int(k N)`` heads,
ablate every other head's output (patching: its output on the counterfactual prompt; mean;
zero), and take ``f(k) = (m(C) - m(empty)) / (m(N) - m(empty))`` with m averaged over the
pairs, m(N) the clean model and m(empty) every head ablated. CPR is the area under f
(trapezoids over k on a linear scale; higher is better), CMD the area under |1 - f| (lower is
better). As MIB does, CPR ranks heads by their signed score and CMD by its absolute value.

Intervals: a percentile bootstrap over pairs (the pairs resampled, the ranking held fixed).
"""

from __future__ import annotations

import numpy as np

PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def area(ks, f) -> tuple[float, float]:
    """(CPR, CMD) of a curve by trapezoids over k."""
    ks, f = np.asarray(ks, float), np.asarray(f, float)
    dx = np.diff(ks)
    cpr = float((dx * (f[:-1] + f[1:]) / 2).sum())
    cmd = float((dx * (np.abs(1 - f[:-1]) + np.abs(1 - f[1:])) / 2).sum())
    return cpr, cmd


def keep_masks(scores: np.ndarray, absolute: bool, ks=PERCENTAGES) -> np.ndarray:
    """[len(ks), layer, head] 0/1 masks of the top int(k N) heads (ties broken by position)."""
    L, H = scores.shape
    flat = np.abs(scores.ravel()) if absolute else scores.ravel()
    order = np.argsort(-flat, kind="stable")
    masks = np.zeros((len(ks), L * H))
    for i, k in enumerate(ks):
        masks[i, order[:int(k * L * H)]] = 1
    return masks.reshape(len(ks), L, H)


def per_pair_metrics(ctx, masks: np.ndarray) -> np.ndarray:
    """m of every pair under each mask: [masks, pairs] (the model run with those heads kept)."""
    import torch

    task = ctx.task
    out = np.zeros((masks.shape[0], task.n))
    gate_all = torch.tensor(masks, dtype=torch.float32, device=task.device)
    M = gate_all.shape[0]
    with task.over(), torch.no_grad():
        for i, b in enumerate(task.batches):
            src = ctx.source(b)
            gate = gate_all.repeat(b.size, 1, 1)  # pair-major: row r is pair r // M, mask r % M
            m = task.gated(b, src, gate, chunk=max(M, 512 // max(1, b.clean.shape[1] // 16)), rows_per_pair=M)
            out[:, b.positions] = m.view(b.size, M).T.double().cpu().numpy()
            ctx.tick(i + 1, "curve")
    return out


def ends(ctx) -> tuple[np.ndarray, np.ndarray]:
    """(m(N), m(empty)) per pair (run once per context: the evaluation and methods that
    measure the curve share them)."""
    if "ends" not in ctx.cache:
        L, H = ctx.task.layers, ctx.task.width
        both = per_pair_metrics(ctx, np.stack([np.ones((L, H)), np.zeros((L, H))]))
        ctx.cache["ends"] = (both[0], both[1])
    return ctx.cache["ends"]


def curve_from(per_pair: np.ndarray, clean: np.ndarray, empty: np.ndarray, rows=None) -> np.ndarray:
    sel = slice(None) if rows is None else rows
    n, e = clean[sel].mean(), empty[sel].mean()
    denom = n - e
    return (per_pair[:, sel].mean(1) - e) / (denom if denom != 0 else np.nan)


def bootstrap(per_signed, per_abs, clean, empty, samples: int = 1000, seed: int = 0, level: float = 0.95):
    """Percentile intervals of CPR (signed ranking) and CMD (absolute ranking) over pairs."""
    rng = np.random.default_rng(seed)
    n = clean.shape[0]
    cprs, cmds = [], []
    for _ in range(samples):
        rows = rng.integers(0, n, n)
        cprs.append(area(PERCENTAGES, curve_from(per_signed, clean, empty, rows))[0])
        cmds.append(area(PERCENTAGES, curve_from(per_abs, clean, empty, rows))[1])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return (tuple(np.nanpercentile(cprs, [lo, hi])), tuple(np.nanpercentile(cmds, [lo, hi])))
