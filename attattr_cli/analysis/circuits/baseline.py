"""The random ranking (seeded), the floor every method must beat."""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register


def _random(ctx) -> np.ndarray:
    table = np.random.default_rng(ctx.seed).random((ctx.task.layers, ctx.task.width))
    return np.broadcast_to(table, (ctx.task.n,) + table.shape).copy()


register(HeadMethod(
    name="random",
    description="a seeded uniform score per head",
    compute=_random,
    kind="baseline",
    mlp=True,
    passes=lambda s: "none",
))
