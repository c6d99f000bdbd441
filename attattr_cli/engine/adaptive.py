"""Error-controlled integration of the attribution path integral.

The attribution map of a layer is linear in G = sum_k w_k dF/dO(alpha_k) (Attr = A * (G V^T)),
so the difference of two rules' maps is the map of the difference of their G. The driver
walks the nested Clenshaw-Curtis levels (2, 3, 5, 9, ... nodes; each reuses every node of
the one before, and alpha = 1 comes free from the clean backward) and stops at the first
level N whose map differs from level N/2's by at most ``tol`` times the largest |Attr| of
the layer. That difference estimates the error of level N/2, so it overestimates the error
of the level returned, which is the finer one.

The driver knows nothing of models: it takes

* ``evaluate(alphas)`` -> (dF/dO at each alpha, unweighted, [k, ...]; F at each alpha, [k]);
* ``magnitude(g)`` -> max |Attr| of the map made from a G.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .integrate import MAX_NODES, doubling_levels

ZERO, ONE = 0.0, 1.0  # node keys: floats, exact for j / 2^k (Fractions of the same value are equal keys)
FIRST_NODES = 5  # the first level compared (with the 3-node level below it)


@dataclass
class Integral:
    g: torch.Tensor  # sum_k w_k dF/dO(alpha_k) of the level returned
    nodes: int  # nodes of that level (alpha = 1 included, free or not)
    error: float  # estimated max |error of Attr| / max |Attr| (that of the level before)
    capped: bool  # the next level would pass the node cap before the tolerance was met
    evaluated: int  # nodes evaluated here (without those given as known)
    f: dict = field(default_factory=dict)  # node key (alpha as a float) -> F, for the nodes evaluated here


class Refinement:
    """One integral refined level by level, driven from outside: :meth:`wanted` gives the
    nodes to evaluate next, :meth:`give` takes their values. Several refinements (one per
    example of a group, say) can so share one pass per level. ``result`` is set once the
    tolerance is met or the node cap stops the refinement."""

    def __init__(self, magnitude: Callable[[torch.Tensor], float], tol: float, max_nodes: int = MAX_NODES,
                 known: dict | None = None):
        if tol <= 0:
            raise ValueError("the tolerance must be positive")
        if max_nodes < 3:
            raise ValueError("the node cap must be at least 3 (two levels to compare)")
        self.magnitude, self.tol = magnitude, tol
        self.values = dict(known or {})
        self.fvals: dict = {}
        self.evaluated = 0
        self.levels = _levels(max_nodes)
        # the first level compared has FIRST_NODES nodes: its nodes and those below are asked for at once
        self.first = next((i for i, level in enumerate(self.levels) if len(level[0]) >= FIRST_NODES),
                          len(self.levels) - 1)
        self.pos = max(self.first - 1, 0)  # the next level to combine
        self.prev: torch.Tensor | None = None
        self.error = float("inf")
        self.result: Integral | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    def wanted(self) -> tuple[list, np.ndarray]:
        """(keys, alphas) of the nodes to evaluate next (none once done)."""
        if self.done:
            return [], np.zeros(0)
        keys, alphas, _ = self.levels[max(self.pos, self.first)]
        new = [i for i, key in enumerate(keys) if key not in self.values]
        return [keys[i] for i in new], alphas[new]

    def give(self, keys: list, grads: torch.Tensor, f: torch.Tensor) -> None:
        """The unweighted dF/dO ([k, ...]) and F ([k]) at the nodes ``keys``; then refine as far
        as the known nodes allow."""
        for row, key in enumerate(keys):
            self.values[key] = grads[row]
            self.fvals[key] = float(f[row])
        self.evaluated += len(keys)
        while not self.done:
            keys_, _, weights = self.levels[self.pos]
            if any(key not in self.values for key in keys_):
                return
            g = _combine([self.values[key] for key in keys_], weights)
            if self.prev is not None:
                self.error = _relative(self.magnitude(g - self.prev), self.magnitude(g))
                if self.error <= self.tol:
                    self.result = Integral(_cast(g, self.values), len(keys_), self.error, False, self.evaluated,
                                           self.fvals)
                    return
            self.prev = g
            self.pos += 1
            if self.pos == len(self.levels):
                self.result = Integral(_cast(g, self.values), len(keys_), self.error, True, self.evaluated,
                                       self.fvals)


@functools.lru_cache(maxsize=8)
def _levels(max_nodes: int) -> tuple:
    """The nested levels (computed once per node cap: every example and layer walks the same).
    Keys become floats, which are exact for j / 2^k and equal (and hash equal) to the Fractions
    that ``known`` may use, and hash much faster."""
    return tuple(([float(k) for k in keys], alphas, weights) for keys, alphas, weights in doubling_levels(max_nodes))


def integrate(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
              magnitude: Callable[[torch.Tensor], float], tol: float, max_nodes: int = MAX_NODES,
              known: dict | None = None) -> Integral:
    """Integrate to relative tolerance ``tol`` (of the map's largest |value|) with at most
    ``max_nodes`` nodes; ``known`` maps alphas (Fractions) to gradients already at hand."""
    refinement = Refinement(magnitude, tol, max_nodes, known)
    while not refinement.done:
        keys, alphas = refinement.wanted()
        grads, f = evaluate(torch.from_numpy(alphas))
        refinement.give(keys, grads, f)
    return refinement.result


def _combine(grads: list[torch.Tensor], weights) -> torch.Tensor:
    """sum_k w_k g_k, accumulated in float64."""
    stacked = torch.stack(grads).to(torch.float64)
    w = torch.as_tensor(weights, dtype=torch.float64, device=stacked.device)
    return torch.tensordot(w, stacked, dims=1)


def _cast(g: torch.Tensor, values: dict) -> torch.Tensor:
    dtype = next(iter(values.values())).dtype
    return g.to(dtype)


def _relative(diff: float, scale: float) -> float:
    if scale > 0:
        return diff / scale
    return 0.0 if diff == 0 else float("inf")
