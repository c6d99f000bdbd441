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

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import torch

from .integrate import MAX_NODES, doubling_levels

ZERO, ONE = Fraction(0), Fraction(1)
FIRST_NODES = 5  # the first level compared (with the 3-node level below it)


@dataclass
class Integral:
    g: torch.Tensor  # sum_k w_k dF/dO(alpha_k) of the level returned
    nodes: int  # nodes of that level (alpha = 1 included, free or not)
    error: float  # estimated max |error of Attr| / max |Attr| (that of the level before)
    capped: bool  # the next level would pass the node cap before the tolerance was met
    evaluated: int  # nodes evaluated here (without those given as known)
    f: dict = field(default_factory=dict)  # alpha (Fraction) -> F, for the nodes evaluated here


def integrate(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
              magnitude: Callable[[torch.Tensor], float], tol: float, max_nodes: int = MAX_NODES,
              known: dict | None = None) -> Integral:
    """Integrate to relative tolerance ``tol`` (of the map's largest |value|) with at most
    ``max_nodes`` nodes; ``known`` maps alphas (Fractions) to gradients already at hand."""
    if tol <= 0:
        raise ValueError("the tolerance must be positive")
    if max_nodes < 3:
        raise ValueError("the node cap must be at least 3 (two levels to compare)")
    values = dict(known or {})
    fvals: dict = {}
    evaluated = 0

    def need(keys, alphas):
        nonlocal evaluated
        new = [i for i, key in enumerate(keys) if key not in values]
        if new:
            grads, f = evaluate(torch.from_numpy(alphas[new]))
            evaluated += len(new)
            for row, i in enumerate(new):
                values[keys[i]] = grads[row]
                fvals[keys[i]] = float(f[row])

    levels = list(doubling_levels(max_nodes))
    # the first level compared has FIRST_NODES nodes: its nodes and those below go in one call
    first = next((i for i, level in enumerate(levels) if len(level[0]) >= FIRST_NODES), len(levels) - 1)
    need(*levels[first][:2])
    prev = g = None
    error = float("inf")
    for keys, alphas, weights in levels[max(first - 1, 0):]:
        need(keys, alphas)
        g = _combine([values[key] for key in keys], weights)
        if prev is not None:
            error = _relative(magnitude(g - prev), magnitude(g))
            if error <= tol:
                return Integral(_cast(g, values), len(keys), error, False, evaluated, fvals)
        prev = g
    return Integral(_cast(g, values), len(keys), error, True, evaluated, fvals)


def _combine(grads: list[torch.Tensor], weights) -> torch.Tensor:
    """sum_k w_k g_k, accumulated in float64."""
    total = None
    for grad, w in zip(grads, weights):
        term = grad.to(torch.float64) * float(w)
        total = term if total is None else total + term
    return total


def _cast(g: torch.Tensor, values: dict) -> torch.Tensor:
    dtype = next(iter(values.values())).dtype
    return g.to(dtype)


def _relative(diff: float, scale: float) -> float:
    if scale > 0:
        return diff / scale
    return 0.0 if diff == 0 else float("inf")
