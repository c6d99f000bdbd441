"""Error-controlled integration of the attribution path integral.

The attribution map of a layer is linear in G = sum_k w_k dF/dO(alpha_k) (Attr = A * (G V^T)),
so the difference of two rules' maps is the map of the difference of their G. The driver
walks the nested Clenshaw-Curtis levels (2, 3, 5, 9, ... nodes; each reuses every node of
the one before, and alpha = 1 comes free from the clean backward) and stops at the first
level N whose map differs from level N/2's by at most ``tol`` times the largest |Attr| of
the layer. That difference estimates the error of level N/2, so it overestimates the error
of the level returned, which is the finer one.

The driver knows nothing of models. :class:`Refinement` refines the integrals of several
examples in lock-step (they share the passes); it is driven from outside (``wanted`` the
nodes, ``give`` their values) and takes ``magnitude(g, rows)`` -> max |Attr| of each row's
map. :func:`integrate` drives one integral from two callables:

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
    """``count`` integrals (the examples of a group, say) refined level by level in lock-step,
    driven from outside: :meth:`wanted` gives the nodes to evaluate next and the integrals
    that want them, :meth:`give` takes their values. Every integral still refining is at the
    same level, so one pass per level serves them all; an integral leaves once its
    tolerance is met or the node cap stops it.

    ``magnitude(g, rows)`` -> max |Attr| of the map of each ``g[i]`` (a tensor [len(rows)]),
    the map of integral ``rows[i]``; ``known`` maps node keys to values [count, ...] at hand."""

    def __init__(self, magnitude: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], count: int, tol: float,
                 max_nodes: int = MAX_NODES, known: dict | None = None):
        if tol <= 0:
            raise ValueError("the tolerance must be positive")
        if max_nodes < 3:
            raise ValueError("the node cap must be at least 3 (two levels to compare)")
        self.magnitude, self.count, self.tol = magnitude, count, tol
        self.values = dict(known or {})  # key -> [count, ...]
        self.fvals: dict = {}  # key -> F [count] (numpy; nan where not evaluated)
        self.levels = _levels(max_nodes)
        # the first level compared has FIRST_NODES nodes: its nodes and those below are asked for at once
        self.first = next((i for i, level in enumerate(self.levels) if len(level[0]) >= FIRST_NODES),
                          len(self.levels) - 1)
        self.pos = max(self.first - 1, 0)  # the next level to combine
        self.rows = torch.arange(count)  # the integrals still refining
        self.prev: torch.Tensor | None = None  # the level below's G of those
        self.g: torch.Tensor | None = None  # the G returned, per integral
        self.nodes = np.zeros(count, dtype=np.int64)
        self.error = np.full(count, np.inf)
        self.capped = np.zeros(count, dtype=bool)
        self.evaluated = np.zeros(count, dtype=np.int64)

    @property
    def done(self) -> bool:
        return len(self.rows) == 0

    def wanted(self) -> tuple[list, np.ndarray, torch.Tensor]:
        """(keys, alphas) of the nodes to evaluate next and the integrals that want them (the
        same nodes for each; none once done)."""
        if self.done:
            return [], np.zeros(0), self.rows
        keys, alphas, _ = self.levels[max(self.pos, self.first)]
        new = [i for i, key in enumerate(keys) if key not in self.values]
        return [keys[i] for i in new], alphas[new], self.rows

    def give(self, keys: list, grads: torch.Tensor, f: torch.Tensor) -> None:
        """The unweighted dF/dO ([len(rows) * len(keys), ...], integral-major) and F at the nodes
        ``keys`` for the integrals :meth:`wanted` named; then refine as far as they allow."""
        rows, k = self.rows, len(keys)
        grads = grads.reshape(len(rows), k, *grads.shape[1:])
        f = f.detach().reshape(len(rows), k).to("cpu", torch.float64)
        for j, key in enumerate(keys):
            if key not in self.values:
                self.values[key] = grads.new_zeros((self.count, *grads.shape[2:]))
                self.fvals[key] = np.full(self.count, np.nan)
            self.values[key][rows] = grads[:, j]
            self.fvals[key][rows.numpy()] = f[:, j].numpy()
        self.evaluated[rows.numpy()] += k
        while not self.done:
            keys_, _, weights = self.levels[self.pos]
            if any(key not in self.values for key in keys_):
                return
            g = _combine([self.values[key][self.rows] for key in keys_], weights)
            if self.prev is not None:
                both = self.magnitude(torch.cat([g - self.prev, g]), torch.cat([self.rows, self.rows]))
                error = _relative(both[:len(self.rows)], both[len(self.rows):])
                met = error <= self.tol
                self.error[self.rows.numpy()] = error.numpy()
                self._finish(met, g, len(keys_), capped=False)
                g = g[~met]
            self.prev = g
            self.pos += 1
            if self.pos == len(self.levels):
                self._finish(torch.ones(len(self.rows), dtype=torch.bool), g, len(keys_), capped=True)

    def _finish(self, which: torch.Tensor, g: torch.Tensor, nodes: int, capped: bool) -> None:
        """Integrals ``self.rows[which]`` end with the G ``g[which]`` of a level of ``nodes`` nodes."""
        if not bool(which.any()):
            return
        dtype = next(iter(self.values.values())).dtype
        if self.g is None:
            self.g = torch.zeros((self.count, *g.shape[1:]), dtype=dtype, device=g.device)
        ended = self.rows[which]
        self.g[ended] = g[which].to(dtype)
        self.nodes[ended.numpy()] = nodes
        self.capped[ended.numpy()] = capped
        self.rows = self.rows[~which]

    def result(self, i: int) -> Integral:
        """Integral ``i`` once done."""
        return Integral(self.g[i], int(self.nodes[i]), float(self.error[i]), bool(self.capped[i]),
                        int(self.evaluated[i]), {key: float(v[i]) for key, v in self.fvals.items() if v[i] == v[i]})


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
    ``max_nodes`` nodes; ``known`` maps node keys (alphas) to gradients already at hand."""
    one = Refinement(lambda g, rows: torch.tensor([magnitude(x) for x in g], dtype=torch.float64), 1, tol,
                     max_nodes, {key: v.unsqueeze(0) for key, v in (known or {}).items()})
    while not one.done:
        keys, alphas, _rows = one.wanted()
        grads, f = evaluate(torch.from_numpy(alphas))
        one.give(keys, grads, f)
    return one.result(0)


def _combine(grads: list[torch.Tensor], weights) -> torch.Tensor:
    """sum_k w_k g_k, accumulated in float64."""
    stacked = torch.stack(grads).to(torch.float64)
    w = torch.as_tensor(weights, dtype=torch.float64, device=stacked.device)
    return torch.tensordot(w, stacked, dims=1)


def _relative(diff, scale):
    """diff / scale (floats or tensors): 0 where both are 0, inf where only the scale is."""
    if torch.is_tensor(diff):
        return torch.where(scale > 0, diff / torch.where(scale > 0, scale, 1),
                           torch.where(diff == 0, 0.0, float("inf")).to(diff.dtype))
    if scale > 0:
        return diff / scale
    return 0.0 if diff == 0 else float("inf")
