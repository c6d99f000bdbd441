"""What a circuit does to the metric: run the pairs with only a set of heads kept (the rest
ablated) and read MIB's ratio f = (m(C) - m(empty)) / (m(N) - m(empty)).

Shared by the evaluation (evaluate.py, on the pairs a ranking is judged on) and by methods that
choose among candidate rankings on the pairs they are given (a method never sees the
evaluation's pairs when the pairs are split: split.py).
"""

from __future__ import annotations

import numpy as np

PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


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


def measured_best(ctx, rankings: list, ks) -> int:
    """The index of the ranking whose curve (CMD's ranking by |score|) is nearest 1 at ``ks``
    on ``ctx``'s pairs, each point weighted by the width CMD's trapezoids give it; each
    distinct set is run once (one forward per pair and set). Ties: the first."""
    masks = np.concatenate([keep_masks(r, True, ks) for r in rankings])
    unique, which = np.unique(masks.reshape(len(masks), -1), axis=0, return_inverse=True)
    clean, empty = ends(ctx)
    f = curve_from(per_pair_metrics(ctx, unique.reshape(-1, *masks.shape[1:])), clean, empty)[which.ravel()]
    ks_all = list(PERCENTAGES)
    width = np.array([(ks_all[min(i + 1, len(ks_all) - 1)] - ks_all[max(i - 1, 0)]) / 2
                      for i in (ks_all.index(k) for k in ks)])
    cost = (np.abs(1 - f.reshape(len(rankings), len(ks))) * width).sum(1)
    return int(np.argmin(cost))
