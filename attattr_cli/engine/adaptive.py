"""Error-controlled integration of the attribution path integral (``--tol``): adaptive subdivision
of the path with an error estimate and a completeness residual per interval.

The path [0, 1] is parametrised by the Clenshaw-Curtis variable t, alpha = (1 - cos(pi t)) / 2.
It starts from the three nodes alpha = 0, 1/2, 1 (:func:`start_factor`); then every interval (a
leaf) carries five nodes t = a, a + h/4, ..., b and two rules on them (:func:`_leaf_rule`), and a
split reuses three of a leaf's nodes in each half. Per leaf:

* e = max |Attr(upper - lower)|, the map's error estimate (the lower rule's error);
* rho = upper(dF/dalpha) - (F(b) - F(a)), its completeness residual (dF/dalpha = sum Attr).

An example-layer is converged when the leaves' estimates summed entry by entry
(:meth:`Refinement._spread`) are <= tol * max |Attr| **and** |sum_I rho_I| <= tol * max(|F(1) -
F(0)|, max |Attr|) plus a floating-point floor. A leaf of t-width 2^-JUMP_DEPTH whose F still
jumps is split no further and the layer flagged non-smooth. :class:`Refinement` refines several
integrals in lock-step, driven from outside; :func:`integrate` drives one from two callables.
docs/integration.md, "`--tol T`: error-controlled integration", explains the rules, the start's
factor, the splitting and the figures.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .. import convergence
from .integrate import clenshaw_curtis
from .options import MAX_NODES

ZERO, ONE = 0.0, 1.0  # node keys: t (floats, exact for j / 2^k); t = 0, 1/2, 1 are alpha = 0, 1/2, 1
JUMP_DEPTH = 9  # a leaf this narrow (t-width 2^-9) whose F still jumps is a jump of F, not a steep change
DEEP_SPLIT = 256.0  # a leaf whose error is this many times its share is split into four at once (docs/integration.md)
JUMP_RATIO = 4.0  # ... jumps: |F(b) - F(a)| > JUMP_RATIO x (b - a in alpha) x the largest |dF/dalpha| at its nodes
CHECK_SECONDS = [0.0]  # process time spent on dF/dalpha at the nodes (the completeness check's only cost), for bench/
REST = 0.9  # a split round leaves the unsplit leaves holding at most this share of an indicator's budget
FLOOR = 16  # the residual test allows FLOOR x machine epsilon of |F(1)| + |F(0)| (and of sum |Attr|)
# the three-node start's estimate: |Attr(Simpson - midpoint)| times min(1, max(START_RATIO x q, START_FLOOR)),
# q = |Simpson's residual| / |the midpoint rule's residual| on dF/dalpha (start_factor; docs/integration.md)
START_RATIO, START_FLOOR = 8.0, 0.5

# convergence states, per example and layer (the store's `convergence`; attattr_cli/convergence.py)
CONVERGED, CAP_HIT, RESIDUAL, NON_SMOOTH, ESTIMATE = (convergence.CONVERGED, convergence.CAP_HIT, convergence.RESIDUAL,
                                                      convergence.NON_SMOOTH, convergence.ESTIMATE)


@dataclass
class Integral:
    g: torch.Tensor  # sum_k w_k dF/dO(alpha_k) returned
    nodes: int  # nodes used (alpha = 1 included, free or not)
    error: float  # estimated max |error of Attr| / max |Attr| (sum over the leaves)
    capped: bool  # the node cap stopped the refinement before it converged
    evaluated: int  # nodes evaluated here (without those given as known)
    f: dict = field(default_factory=dict)  # node key (t) -> F, for every node used
    status: int = CONVERGED  # one of the convergence states above
    residual: float = 0.0  # sum Attr - (F(1) - F(0)) of the map returned
    leaves: int = 1  # intervals the path ended in
    weights: dict = field(default_factory=dict)  # node key (t) -> its weight in g (the rule the leaves make)


def alpha_of(t: float) -> float:
    """The path position of node key t (exact at 0, 1/2 and 1)."""
    if t in (0.0, 0.5, 1.0):
        return t
    return (1.0 - math.cos(math.pi * t)) / 2.0


def coarse_start() -> bool:
    """Whether integrals start from the three-node pair (two evaluated nodes) rather than the
    five-node rule (four): always. A function, so that benches can compare the five-node start."""
    return True


def start_factor(simpson_residual: float, midpoint_residual: float, noise: float) -> float:
    """The factor on the three-node start's estimate max |Attr(Simpson - midpoint)|: START_RATIO x q,
    q = |simpson_residual| / |midpoint_residual| (the rules' exact errors on dF/dalpha), clipped to
    [START_FLOOR, 1]; 1 where the midpoint residual is at the floating-point ``noise``
    (docs/integration.md, "How the start reads Simpson's error")."""
    if not abs(midpoint_residual) > noise:
        return 1.0
    return min(1.0, max(START_RATIO * abs(simpson_residual) / abs(midpoint_residual), START_FLOOR))


def residual_scale(effect: float, big: float) -> float:
    """What a layer's completeness residual is measured against: the larger of the layer's
    effect |F(A) - F(0)| and its largest single interaction max |Attr| (docs/integration.md)."""
    return max(abs(effect), abs(big))


def residual_ok(residual: float, scale: float, f_scale: float, tol: float, eps_f: float, eps_acc: float) -> bool:
    """Whether a completeness residual agrees with a map converged to ``tol``: |residual| <=
    tol x ``scale`` (:func:`residual_scale`), plus a floating-point floor (``f_scale`` =
    |F(1)| + |F(0)|)."""
    return abs(residual) <= tol * scale + FLOOR * (eps_f * f_scale + eps_acc * scale)


def judge(error: float, residual: float, scale: float, f_scale: float, tol: float, eps_f: float,
          eps_acc: float) -> int:
    """The state of a fixed rule's example-layer: its embedded estimate ``error`` (nan: none)
    against ``tol``, and its completeness residual as :func:`residual_ok` reads it."""
    if not residual_ok(residual, scale, f_scale, tol, eps_f, eps_acc):
        return RESIDUAL
    if error == error and error > tol:
        return ESTIMATE
    return CONVERGED


@functools.lru_cache(maxsize=4096)
def _leaf_rule(ta: float, tb: float, coarse: bool = False) -> tuple[tuple[float, ...], np.ndarray, np.ndarray]:
    """The node keys of the leaf [ta, tb] (five; three for the coarse start) and the weights
    (on them) of its upper and lower rule for the integral over alpha(ta)..alpha(tb)."""
    if coarse:  # the whole path's first try: Clenshaw-Curtis 3 (Simpson's rule in alpha) over the midpoint rule
        return (ZERO, 0.5, ONE), clenshaw_curtis(2)[1], np.array([0.0, 1.0, 0.0])
    h = tb - ta
    keys = tuple(ta + h * j / 4 for j in range(5))
    if ta == 0.0 and tb == 1.0:  # the whole path: Clenshaw-Curtis 5 and 3, exact in alpha
        upper = clenshaw_curtis(4)[1]
        lower = np.zeros(5)
        lower[0::2] = clenshaw_curtis(2)[1]
        return keys, upper, lower
    jac = np.array([math.pi / 2 * math.sin(math.pi * t) for t in keys])  # dalpha/dt
    upper = h * np.array([7, 32, 12, 32, 7]) / 90 * jac  # Boole in t
    # Simpson's rule in t on three of the nodes: upper - lower is the error of the lower rule,
    # an overestimate of the upper one's (not divided by 15 as adaptive Simpson does: docs/integration.md)
    lower = h * np.array([1, 0, 4, 0, 1]) / 6 * jac
    return keys, upper, lower


@functools.lru_cache(maxsize=16)
def _level_rules(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights on the nodes t = j/n of the Clenshaw-Curtis rule with n intervals and of the one
    with n/2 (zero on the nodes it does not use)."""
    upper = clenshaw_curtis(n)[1]
    lower = np.zeros(n + 1)
    lower[0::2] = clenshaw_curtis(n // 2)[1]
    return upper, lower


def _weighted(row: "_Row", keys, *weights) -> list[torch.Tensor]:
    """sum_k w_k g(key_k) of the row's node gradients for each weight vector, in float64."""
    stacked = torch.stack([row.g[k] for k in keys]).to(torch.float64)
    return [torch.tensordot(torch.as_tensor(w, dtype=torch.float64, device=stacked.device), stacked, 1)
            for w in weights]


class _Leaf:
    __slots__ = ("ta", "tb", "q", "d", "e", "rho", "jump", "score", "coarse")

    def __init__(self, ta: float, tb: float, coarse: bool = False):
        self.ta, self.tb = ta, tb
        self.coarse = coarse  # the whole path's three-node start (alpha = 0, 1/2, 1)
        self.q = None  # the upper rule's G on this leaf
        self.d = None  # the upper rule's G minus the lower rule's (the estimate's G)
        self.e = 0.0  # max |Attr(upper - lower)|
        self.rho = 0.0  # completeness residual of the leaf
        self.jump = False
        self.score = 0.0

    def rule(self) -> tuple[tuple[float, ...], np.ndarray, np.ndarray]:
        return _leaf_rule(self.ta, self.tb, self.coarse)


class _Row:
    """One integral's nodes and leaves."""

    def __init__(self, coarse: bool = True):
        self.g: dict = {}  # key -> unweighted dF/dO
        self.f: dict = {}  # key -> F
        self.s: dict = {}  # key -> dF/dalpha (sum of the node's map)
        self.leaves: list[_Leaf] = [_Leaf(ZERO, ONE, coarse)]
        self.evaluated = 0

    def used(self) -> int:
        """Nodes the leaves use (a caller may have given more: engine/generation.py hands every
        step of a layer the nodes its shared passes computed for the others)."""
        return len({k for leaf in self.leaves for k in leaf.rule()[0]})

    def missing(self) -> list[float]:
        keys = {k for leaf in self.leaves if leaf.q is None for k in leaf.rule()[0]}
        return sorted(k for k in keys if k not in self.g)


class Refinement:
    """``count`` integrals (the examples of a group, say) refined in lock-step, driven from
    outside: :meth:`wanted` gives the (integral, node) pairs to evaluate next, :meth:`give`
    takes their values. An integral leaves once converged, flagged, or stopped by the node
    cap; :meth:`result` gives it.

    ``measure(g, rows)`` -> [len(rows), 3]: max |Attr|, sum |Attr|, sum Attr of the map of
    each ``g[i]`` in integral ``rows[i]``; ``derivative(g, rows)`` (optional) -> sum Attr alone,
    which is <g, A V> and cheaper than the map (the nodes' dF/dalpha need only that);
    ``spread`` as :meth:`_spread` reads it. ``known`` maps node keys to gradients at hand
    ([count, ...]) and ``known_f`` the same keys to F there ([count]): the clean forward's
    alpha = 1."""

    def __init__(self, measure: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], count: int, tol: float,
                 max_nodes: int = MAX_NODES, known: dict | None = None, known_f: dict | None = None,
                 derivative: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 coarse: bool = True, spread: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        if tol <= 0:
            raise ValueError("the tolerance must be positive")
        if max_nodes < 5:
            raise ValueError("the node cap must be at least 5 (the first leaf's nodes)")
        known, known_f = dict(known or {}), dict(known_f or {})
        if set(known) - set(known_f):
            raise ValueError("a node given as known needs F there too (known_f)")
        self.measure, self.count, self.tol, self.max_nodes = measure, count, tol, max_nodes
        self.derivative = derivative
        self.spread = spread
        self.rows = [_Row(coarse) for _ in range(count)]
        # the scale an integral's error and residual are judged against is at least this (the
        # largest kept number of the example's layers done so far, with --keep sources:
        # docs/integration.md, "What is judged, and on which scale"); 0: each integral's own
        self.floor = 0.0
        # the same per integral (a generation's steps, each judged on its own kept table); the larger one counts
        self.floors = [0.0] * count
        self.shared = False  # True: the integrals are the layers of one example, judged on one scale (raises floor)
        self.active = list(range(count))
        self.dtype = None
        self.eps_f = self.eps_acc = 0.0
        self.g: torch.Tensor | None = None  # the G returned, per integral
        self.out: list[Integral | None] = [None] * count
        self._known = (known, known_f)

    @property
    def done(self) -> bool:
        return not self.active

    def wanted(self) -> tuple[torch.Tensor, list, np.ndarray]:
        """(owner, keys, alphas): integral ``owner[r]`` wants node ``keys[r]`` (at ``alphas[r]``),
        integral-major; empty once done."""
        owner, keys = [], []
        for i in self.active:
            for k in self._row(i).missing():
                owner.append(i)
                keys.append(k)
        return (torch.tensor(owner, dtype=torch.long), keys,
                np.array([alpha_of(k) for k in keys], dtype=np.float64))

    def _row(self, i: int) -> _Row:
        row = self.rows[i]
        known, known_f = self._known
        for key in known:
            if key not in row.g:
                row.g[key] = known[key][i]
                row.f[key] = float(known_f[key][i])
        return row

    def give(self, owner: torch.Tensor, keys: list, grads: torch.Tensor, f: torch.Tensor) -> None:
        """The unweighted dF/dO ([len(owner), ...]) and F ([len(owner)]) at the pairs :meth:`wanted`
        named; then refine as far as they allow."""
        if self.dtype is None:
            self.dtype = grads.dtype
            self.eps_f = float(torch.finfo(f.dtype).eps) if f.is_floating_point() else 0.0
            self.eps_acc = float(torch.finfo(grads.dtype).eps)
        fs = f.detach().to("cpu", torch.float64).numpy()
        owner = owner.tolist() if torch.is_tensor(owner) else list(owner)
        for r, (i, key) in enumerate(zip(owner, keys)):
            row = self._row(i)
            row.g[key] = grads[r]
            row.f[key] = float(fs[r])
            row.evaluated += 1
        self._derivatives()
        self._evaluate_leaves()
        self._judge()

    # -- the steps of a round --------------------------------------------------------
    def _derivatives(self) -> None:
        """dF/dalpha at every node not yet measured (one measure call)."""
        start = time.process_time()
        need = [(i, k) for i in self.active for k in self.rows[i].g if k not in self.rows[i].s]
        if need:
            gs, owners = [self.rows[i].g[k] for i, k in need], [i for i, _ in need]
            if self.derivative is None:
                sums = self._measure(gs, owners)[:, 2]
            else:
                sums = torch.as_tensor(self.derivative(torch.stack([x.to(self.dtype) for x in gs]),
                                                       torch.tensor(owners, dtype=torch.long)), dtype=torch.float64)
            for (i, k), s in zip(need, sums.tolist()):
                self.rows[i].s[k] = s
        CHECK_SECONDS[0] += time.process_time() - start

    def _evaluate_leaves(self) -> None:
        """The two rules, e and rho of every leaf whose nodes are all at hand (one measure call)."""
        todo, diffs, owners = [], [], []
        for i in self.active:
            row = self.rows[i]
            for leaf in row.leaves:
                if leaf.q is not None:
                    continue
                keys, upper, lower = leaf.rule()
                if any(k not in row.g for k in keys):
                    continue
                leaf.q, low = _weighted(row, keys, upper, lower)
                s = np.array([row.s[k] for k in keys])
                change = row.f[keys[-1]] - row.f[keys[0]]
                leaf.rho = float(upper @ s) - change
                todo.append(leaf)
                leaf.d = leaf.q - low
                if not leaf.coarse:  # as the start reads Simpson's error (its own factor at _step)
                    noise = FLOOR * self.eps_f * (abs(row.f[keys[-1]]) + abs(row.f[keys[0]]))
                    leaf.d = leaf.d * start_factor(leaf.rho, float(lower @ s) - change, noise)
                diffs.append(leaf.d)
                owners.append(i)
        if todo:
            es = self._measure(diffs, owners)[:, 0]
            for leaf, e in zip(todo, es.tolist()):
                leaf.e = e

    def _judge(self) -> None:
        """Converged, flagged or capped integrals leave; the others get leaves split."""
        ready = [i for i in self.active if all(leaf.q is not None for leaf in self.rows[i].leaves)]
        if not ready:
            return
        # where the leaves are equal (every one split as often), their nodes are those of one
        # Clenshaw-Curtis rule on the whole path, and of the rule with half of them below it:
        # for a smooth integrand the pair converges much faster than the leaves' own rules
        level = {i: self._level(self.rows[i]) for i in ready}
        level = {i: v for i, v in level.items() if v is not None}
        if level:
            rows = list(level)
            measured = self._measure([level[i][2] - level[i][3] for i in rows] + [level[i][2] for i in rows],
                                     rows + rows).tolist()
            if self.shared:
                self.floor = max([self.floor, *(m[0] for m in measured[len(rows):])])
            ended = []
            for k, i in enumerate(rows):
                keys, upper, g_up, _g_low, integral = level[i]
                if self._level_converged(i, keys, upper, g_up, integral, measured[k][0],
                                         max(measured[len(rows) + k][0], self.floor, self.floors[i])):
                    ended.append(i)
            ready = [i for i in ready if i not in ended]
        if not ready:
            return
        totals = [torch.stack([leaf.q for leaf in self.rows[i].leaves]).sum(0) for i in ready]
        bigs = self._measure(totals, ready)[:, 0].tolist()
        if self.shared:
            self.floor = max([self.floor, *bigs])
        for i, total, big in zip(ready, totals, bigs):
            self._step(i, total, max(big, self.floor, self.floors[i]))

    def _level(self, row: _Row):
        """(node keys, weights of the Clenshaw-Curtis rule on all of them, its G, G of the rule on
        every other node, its integral of dF/dalpha) where the leaves are two or more of equal
        width; else None."""
        leaves = row.leaves
        widths = {leaf.tb - leaf.ta for leaf in leaves}
        if len(leaves) < 2 or len(widths) != 1 or any(leaf.jump for leaf in leaves):
            return None
        n = 4 * len(leaves)
        keys = [j / n for j in range(n + 1)]
        if any(k not in row.g for k in keys):
            return None
        upper, lower = _level_rules(n)
        g_up, g_low = _weighted(row, keys, upper, lower)
        return keys, upper, g_up, g_low, float(upper @ np.array([row.s[k] for k in keys]))

    def _level_converged(self, i: int, keys: list, upper: np.ndarray, g: torch.Tensor, integral: float, diff: float,
                         big: float) -> bool:
        """Finish integral ``i`` with the whole-path rule if its estimate and residual agree."""
        row, tol = self.rows[i], self.tol
        error = relative(diff, big)
        residual = integral - (row.f[ONE] - row.f[ZERO])
        scale = residual_scale(row.f[ONE] - row.f[ZERO], big)
        if error <= tol and residual_ok(residual, scale, abs(row.f[ONE]) + abs(row.f[ZERO]), tol, self.eps_f,
                                        self.eps_acc):
            self._finish(i, g, error, residual, CONVERGED, False, weights=dict(zip(keys, upper.tolist())))
            return True
        return False

    def _step(self, i: int, total: torch.Tensor, big: float) -> None:
        row, tol = self.rows[i], self.tol
        held = sum(leaf.e for leaf in row.leaves)
        spread = self._spread(i, held)
        error = relative(spread, big)
        residual = sum(leaf.rho for leaf in row.leaves)
        f_scale = abs(row.f[ONE]) + abs(row.f[ZERO])
        effect = row.f[ONE] - row.f[ZERO]
        scale = residual_scale(effect, big)
        if row.leaves[0].coarse:  # Simpson's error, from the midpoint rule's and the two residuals
            error *= start_factor(residual, row.s[0.5] - effect, FLOOR * (self.eps_f * f_scale + self.eps_acc * scale))
        smooth_residual = residual - sum(leaf.rho for leaf in row.leaves if leaf.jump)
        jumps = any(leaf.jump for leaf in row.leaves)
        residual_agrees = residual_ok(smooth_residual, scale, f_scale, tol, self.eps_f, self.eps_acc)
        if error <= tol and residual_agrees:
            return self._finish(i, total, error, residual, NON_SMOOTH if jumps else CONVERGED, False)
        if row.leaves[0].coarse:  # the three-node start did not do: the whole path's five nodes (two more)
            row.leaves = [_Leaf(ZERO, ONE)]
            return
        # the leaves' e over the budget as the entry-by-entry sum reads them: the budget scaled by held / spread
        split = self._to_split(row, big * held / max(spread, 1e-300) if held > 0 else big, scale, error > tol,
                               not residual_agrees)
        if not split:  # what is left over tolerance sits in jumps (_to_split may have marked more)
            jumps = any(leaf.jump for leaf in row.leaves)
            state = NON_SMOOTH if jumps else (CONVERGED if residual_agrees else RESIDUAL)
            return self._finish(i, total, error, residual, state, False)
        room = self.max_nodes - row.used()
        if room < 4:
            state = NON_SMOOTH if jumps else (CAP_HIT if error > tol else RESIDUAL)
            return self._finish(i, total, error, residual, state, True)
        depth = {}  # a leaf far over its share is split twice at once (one pass instead of two)
        for leaf in split:  # the largest first: where the cap stops the splits, they went there
            want = 2 if leaf.score >= DEEP_SPLIT and leaf.tb - leaf.ta > 2.0 ** -JUMP_DEPTH else 1
            cost = 4 if want == 1 else 12
            if cost > room and want == 2:
                want, cost = 1, 4
            if cost > room:
                break
            depth[id(leaf)] = want
            room -= cost
        leaves = []
        for leaf in row.leaves:
            d = depth.get(id(leaf))
            if d is None:
                leaves.append(leaf)
                continue
            parts = 2 ** d
            h = (leaf.tb - leaf.ta) / parts
            leaves += [_Leaf(leaf.ta + k * h, leaf.ta + (k + 1) * h if k < parts - 1 else leaf.tb) for k in range(parts)]
        row.leaves = leaves

    def _to_split(self, row: _Row, big: float, scale: float, over_e: bool, over_r: bool) -> list[_Leaf]:
        """The leaves to split, largest first: for each indicator over its budget (tol x max |Attr|
        for sum e, tol x the residual scale for the residual), the fewest leaves holding the
        most of it, until what the others hold is at most REST x the budget (by what a leaf holds,
        not per width: docs/integration.md). A narrow leaf whose F jumps across is marked a jump
        instead (split no further)."""
        tol, chosen = self.tol, {}
        leaves = [leaf for leaf in row.leaves if not leaf.jump]
        for over, size, budget in ((over_e, lambda leaf: leaf.e, tol * big),
                                   (over_r, lambda leaf: abs(leaf.rho), tol * scale)):
            if not over:
                continue
            rest = sum(size(leaf) for leaf in leaves)
            for leaf in sorted(leaves, key=size, reverse=True):
                if rest <= REST * budget:
                    break
                rest -= size(leaf)
                chosen[id(leaf)] = max(chosen.get(id(leaf), 0.0), size(leaf) / max(budget * (leaf.tb - leaf.ta), 1e-300))
        split = []
        for leaf in leaves:
            if id(leaf) not in chosen:
                continue
            floor = FLOOR * self.eps_f * (abs(row.f[leaf.ta]) + abs(row.f[leaf.tb]))
            if (abs(leaf.rho) > tol * scale * (leaf.tb - leaf.ta) + floor and leaf.tb - leaf.ta <= 2.0 ** -JUMP_DEPTH
                    and self._jumps(row, leaf)):
                leaf.jump = True
                continue
            leaf.score = chosen[id(leaf)]  # what it holds per width, against the budget (DEEP_SPLIT reads it)
            split.append(leaf)
        split.sort(key=lambda leaf: -max(leaf.e / max(tol * big, 1e-300), abs(leaf.rho) / max(tol * scale, 1e-300)))
        return split

    def _spread(self, i: int, held: float) -> float:
        """The leaves' estimates of integral ``i`` summed entry by entry: max over the map's
        entries of sum_I |Attr(upper_I - lower_I)| (``spread``), never above ``held`` = sum_I
        max |Attr(upper_I - lower_I)| (docs/integration.md). ``held`` where there is no ``spread``
        or a single leaf."""
        leaves = self.rows[i].leaves
        if self.spread is None or len(leaves) < 2 or held == 0:
            return held
        d = torch.stack([leaf.d.to(self.dtype) for leaf in leaves])
        return min(held, float(self.spread(d, torch.full((len(leaves),), i, dtype=torch.long))))

    @staticmethod
    def _jumps(row: _Row, leaf: _Leaf) -> bool:
        """Whether F changes across the leaf faster than any derivative at its nodes explains."""
        keys = leaf.rule()[0]
        change = abs(row.f[leaf.tb] - row.f[leaf.ta])
        slope = max(abs(row.s[k]) for k in keys)
        return change > JUMP_RATIO * (alpha_of(leaf.tb) - alpha_of(leaf.ta)) * slope

    def _finish(self, i: int, total: torch.Tensor, error: float, residual: float, state: int, capped: bool,
                weights: dict | None = None) -> None:
        row = self.rows[i]
        if self.g is None:
            self.g = torch.zeros((self.count, *total.shape), dtype=self.dtype, device=total.device)
        self.g[i] = total.to(self.dtype)
        if weights is None:
            weights = {}
            for leaf in row.leaves:
                keys, upper, _ = leaf.rule()
                for k, w in zip(keys, upper):
                    weights[k] = weights.get(k, 0.0) + float(w)
        self.out[i] = Integral(self.g[i], row.used(), float(error), capped, row.evaluated,
                               dict(row.f), state, float(residual), len(row.leaves), weights)
        self.active.remove(i)
        row.g = {}  # the node gradients are no longer needed

    def _measure(self, gs: list, owners: list) -> torch.Tensor:
        g = torch.stack([x.to(self.dtype) for x in gs])
        return torch.as_tensor(self.measure(g, torch.tensor(owners, dtype=torch.long)), dtype=torch.float64).reshape(len(gs), 3)

    def result(self, i: int) -> Integral:
        """Integral ``i`` once done."""
        return self.out[i]

    def run(self, evaluate: Callable, on_round: Callable | None = None) -> "Refinement":
        """Refine until every integral is done: ``evaluate(owner, keys, alphas)`` -> (owner, keys,
        unweighted dF/dO, F) of the pairs :meth:`wanted` names (and of any more at hand);
        ``on_round(self)`` after each round."""
        while not self.done:
            self.give(*evaluate(*self.wanted()))
            if on_round is not None:
                on_round(self)
        return self


def integrate(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
              measure: Callable[[torch.Tensor], torch.Tensor], tol: float, max_nodes: int = MAX_NODES,
              known: dict | None = None, known_f: dict | None = None,
              derivative: Callable[[torch.Tensor], torch.Tensor] | None = None, coarse: bool = True,
              spread: Callable[[torch.Tensor], torch.Tensor] | None = None, floor: float = 0.0) -> Integral:
    """Integrate one example-layer to ``tol`` with at most ``max_nodes`` nodes.
    ``evaluate(alphas)`` -> (unweighted dF/dO at each alpha [k, ...], F there [k]);
    ``measure(g)`` -> (max |Attr|, sum |Attr|, sum Attr) of a G's map; ``known`` / ``known_f``
    map node keys to the gradient and F already at hand (the clean forward's alpha = 1);
    ``derivative(g)`` (optional) -> sum Attr of each ``g[i]``'s map, cheaper than ``measure``;
    ``spread(g)`` (optional) -> max over entries of sum_i |Attr(g[i])| (:meth:`Refinement._spread`);
    ``floor``: the least scale the error and the residual are judged against (:class:`Refinement`)."""
    one = Refinement(lambda g, rows: torch.tensor([list(measure(x)) for x in g], dtype=torch.float64), 1, tol,
                     max_nodes, {key: v.unsqueeze(0) for key, v in (known or {}).items()},
                     {key: [v] for key, v in (known_f or {}).items()},
                     None if derivative is None else (lambda g, rows: derivative(g)), coarse,
                     None if spread is None else (lambda g, rows: spread(g)))
    one.floor = float(floor)
    return one.run(lambda owner, keys, alphas: (owner, keys, *evaluate(torch.from_numpy(alphas)))).result(0)


def relative(diff: float, scale: float) -> float:
    """diff / scale: 0 where both are 0, inf where only the scale is."""
    if scale > 0:
        return diff / scale
    return 0.0 if diff == 0 else float("inf")
