"""Keep the top heads, ablate the rest: the one evaluation of ``prune`` and ``circuit``.
:func:`under_masks` runs every example under many head masks ([layer, head] of 1 kept and 0
ablated, gates between; or one per example), several per pass; :func:`per_pair_metrics` gives
the pair metrics on a circuits ``Context`` (the ablated heads' outputs moved to the ablation's
source by one ``HeadPatch`` plan); :func:`ratio`, :func:`curve_from` and :func:`curve` the
faithfulness ratio (m(C) - m(empty)) / (m(N) - m(empty)) (:func:`ends`: m(N) and m(empty)).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

#: tokens per forward pass when several head masks share it (the batch of examples repeated
#: once per mask); 1: one mask per pass
MASK_TOKENS = 16384
PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def under_masks(batches: Sequence, masks: Sequence[torch.Tensor], run: Callable, n: int, widest: int,
                max_tokens: int = MASK_TOKENS, on_masks: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """Per mask the values of the ``n`` examples (CPU, the examples' order): ``masks`` are
    ``[layer, head]`` for every example or ``[examples, layer, head]`` one per example;
    ``run(batch, gate)`` gives the values [rows, ...] of ``batch`` (its ``positions`` index the
    examples) repeated once per mask, mask-major, under ``gate`` [rows, layer, head]. Each
    batch runs once per group of masks, at most ``max_tokens`` tokens per pass (``widest``: the
    tokens of the largest batch); ``on_masks(k)``: after each group of k masks."""
    per = max(1, max_tokens // max(widest, 1))
    out: list[torch.Tensor] = []
    for start in range(0, len(masks), per):
        group = masks[start:start + per]
        full = None
        for b in batches:
            rows = len(b.positions)
            got = run(b, torch.cat([m.expand(rows, *m.shape) if m.dim() == 2 else m[b.positions] for m in group]))
            got = got.reshape(len(group), rows, *got.shape[1:])
            if full is None:
                full = torch.empty(len(group), n, *got.shape[2:], dtype=got.dtype)
            full[:, b.positions] = got
        out.extend(full.unbind(0) if full is not None else [torch.empty(0, 0)] * len(group))
        if on_masks is not None:
            on_masks(len(group))
    return out


def counting(progress: Callable[[int, int, str], None] | None, total: int, what: str, done: int = 0
             ) -> Callable[[int], None]:
    """An ``on_masks`` for :func:`under_masks` that tells ``progress(done, total, what)`` after each group."""
    def tick(k: int) -> None:
        nonlocal done
        done += k
        if progress is not None:
            progress(done, total, what)
    return tick


def keep_masks(scores: np.ndarray, absolute: bool, ks=PERCENTAGES) -> np.ndarray:
    """[len(ks), layer, head] 0/1 masks of the top int(k N) heads (ties broken by position)."""
    L, H = scores.shape
    flat = np.abs(scores.ravel()) if absolute else scores.ravel()
    order = np.argsort(-flat, kind="stable")
    masks = np.zeros((len(ks), L * H))
    for i, k in enumerate(ks):
        masks[i, order[:int(k * L * H)]] = 1
    return masks.reshape(len(ks), L, H)


def per_pair_metrics(ctx, masks, max_tokens: int = MASK_TOKENS) -> np.ndarray:
    """m of every pair of ``ctx.task`` under each mask ([masks, layer, node] gates, 1 kept, 0
    ablated by ``ctx.ablation``): [masks, pairs], several masks per pass (:func:`under_masks`)."""
    task = ctx.task
    gates = list(torch.as_tensor(np.asarray(masks), dtype=torch.float32, device=task.device))
    with task.over(), torch.no_grad():
        got = under_masks(task.batches, gates, lambda b, gate: task.gated(b, ctx.source(b), gate).cpu(), task.n,
                          max(b.clean.numel() for b in task.batches), max_tokens,
                          counting(ctx.progress, len(gates), "curve"))
    return torch.stack(got).numpy() if got else np.zeros((0, task.n))


def ends(ctx) -> tuple[np.ndarray, np.ndarray]:
    """(m(N), m(empty)) per pair (run once per context: the evaluation and methods that
    measure the curve share them)."""
    if "ends" not in ctx.cache:
        L, H = ctx.task.layers, ctx.task.width
        both = per_pair_metrics(ctx, np.stack([np.ones((L, H)), np.zeros((L, H))]))
        ctx.cache["ends"] = (both[0], both[1])
    return ctx.cache["ends"]


def ratio(values, full: float, empty: float) -> np.ndarray:
    """(m - m(empty)) / (m(N) - m(empty)) of each mean metric in ``values``; NaN where m(N) = m(empty)."""
    gap = full - empty
    return (np.asarray(values, np.float64) - empty) / (gap if gap != 0 else np.nan)


def curve_from(per_pair: np.ndarray, clean: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """f of each mask from the metrics [masks, pairs] and the ends per pair (means over the pairs)."""
    return ratio(per_pair.mean(1), clean.mean(), empty.mean())


def curve(ctx, masks) -> tuple[np.ndarray, np.ndarray]:
    """(m of every pair under each mask [masks, pairs], f of each mask) on ``ctx``'s pairs."""
    per = per_pair_metrics(ctx, masks)
    return per, curve_from(per, *ends(ctx))
