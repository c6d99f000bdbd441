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
    prev = g = None
    error = float("inf")
    for keys, alphas, weights in doubling_levels(max_nodes):
        new = [i for i, key in enumerate(keys) if key not in values]
        if new:
            grads, f = evaluate(torch.from_numpy(alphas[new]))
            evaluated += len(new)
            for row, i in enumerate(new):
                values[keys[i]] = grads[row]
                fvals[keys[i]] = float(f[row])
        g = _combine([values[key] for key in keys], weights)
        if prev is not None:
            error = _relative(magnitude(g - prev), magnitude(g))
            if error <= tol:
                return Integral(_cast(g, values), len(keys), error, False, evaluated, fvals)
        prev = g
    return Integral(_cast(g, values), len(keys), error, True, evaluated, fvals)


def integrate_bisect(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                     magnitude: Callable[[torch.Tensor], float], tol: float, max_nodes: int = MAX_NODES,
                     known: dict | None = None) -> Integral:
    """Globally adaptive bisection: each interval carries Boole's rule on five equally spaced
    nodes with Simpson's rule on three of them embedded; the intervals with the largest
    estimated error are halved (four new nodes per halving, every old node reused) until
    the map of sum(Boole - Simpson) is below ``tol`` x max |Attr|."""
    if tol <= 0:
        raise ValueError("the tolerance must be positive")
    if max_nodes < 5:
        raise ValueError("the node cap must be at least 5 (one interval)")
    values = dict(known or {})
    fvals: dict = {}
    evaluated = 0

    def need(keys):
        nonlocal evaluated
        new = sorted({k for k in keys if k not in values})
        if new:
            grads, f = evaluate(torch.tensor([float(k) for k in new], dtype=torch.float64))
            evaluated += len(new)
            for row, key in enumerate(new):
                values[key] = grads[row]
                fvals[key] = float(f[row])

    def five(a, b):
        return [a + (b - a) * Fraction(k, 4) for k in range(5)]

    def rules(a, b):  # (Boole, Boole - Simpson) of the interval
        v = [values[k] for k in five(a, b)]
        h = float(b - a)
        boole = _combine(v, [h * w / 90 for w in (7, 32, 12, 32, 7)])
        simpson = _combine([v[0], v[2], v[4]], [h / 6, 4 * h / 6, h / 6])
        return boole, boole - simpson

    intervals = [(ZERO, ONE)]
    need(five(ZERO, ONE))
    local = {iv: rules(*iv) for iv in intervals}
    while True:
        g = _combine([local[iv][0] for iv in intervals], [1.0] * len(intervals))
        diff = _combine([local[iv][1] for iv in intervals], [1.0] * len(intervals))
        error = _relative(magnitude(diff), magnitude(g))
        if error <= tol:
            return Integral(_cast(g, values), len(values), error, False, evaluated, fvals)
        sizes = {iv: magnitude(local[iv][1]) for iv in intervals}
        worst = max(sizes.values())
        room = (max_nodes - len(values)) // 4
        split = sorted((iv for iv in intervals if sizes[iv] >= worst / 2), key=lambda iv: -sizes[iv])[:room]
        if not split:
            return Integral(_cast(g, values), len(values), error, True, evaluated, fvals)
        halves = []
        for a, b in split:
            mid = (a + b) / 2
            halves += [(a, mid), (mid, b)]
        need([k for iv in halves for k in five(*iv)])
        for iv in split:
            intervals.remove(iv)
            del local[iv]
        for iv in halves:
            local[iv] = rules(*iv)
        intervals = sorted(intervals + halves)


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
