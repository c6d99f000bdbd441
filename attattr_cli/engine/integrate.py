"""Quadrature rules for the path integral over alpha in [0, 1] (docs/method.md section 1.2).

Fixed rules (:func:`nodes`) take m nodes; :func:`embedded` gives each of them a lower-order
rule on the same nodes, whose difference from the rule estimates how converged it is. The
error-controlled integration (:mod:`.adaptive`) subdivides the path itself.
"""

from __future__ import annotations


import numpy as np
import torch

from ..errors import OptionError
from .options import RULES  # the rule names live with the options (no torch there)


def nodes(rule: str, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (alphas, weights), float64 tensors of length ``steps``; weights sum to 1."""
    if steps < 1:
        raise OptionError(f"--steps must be at least 1, got {steps}")
    k = np.arange(steps, dtype=np.float64)
    if rule == "right":
        alphas, weights = (k + 1) / steps, np.full(steps, 1.0 / steps)
    elif rule == "left":
        alphas, weights = k / steps, np.full(steps, 1.0 / steps)
    elif rule == "midpoint":
        alphas, weights = (k + 0.5) / steps, np.full(steps, 1.0 / steps)
    elif rule == "gauss":
        x, w = np.polynomial.legendre.leggauss(steps)
        alphas, weights = (x + 1.0) / 2.0, w / 2.0
    elif rule == "clenshaw-curtis":
        if steps < 2:
            raise OptionError("--rule clenshaw-curtis needs at least 2 nodes (--steps 2: the trapezoid rule)")
        alphas, weights = clenshaw_curtis(steps - 1)
    else:
        raise OptionError(f"unknown rule '{rule}'; available: {', '.join(RULES)}")
    return torch.from_numpy(alphas), torch.from_numpy(weights)


def clenshaw_curtis(intervals: int) -> tuple[np.ndarray, np.ndarray]:
    """Clenshaw-Curtis nodes alpha_j = (1 - cos(pi j / N))/2, j = 0..N, and weights on [0, 1]
    (N = ``intervals``); exact for polynomials of degree N (N + 1 if N is even)."""
    n = int(intervals)
    if n < 1:
        raise ValueError("Clenshaw-Curtis needs at least one interval")
    j = np.arange(n + 1)
    theta = np.pi * j / n
    w = np.ones(n + 1)
    for k in range(1, n // 2 + 1):
        b = 1.0 if 2 * k == n else 2.0
        w -= b / (4 * k * k - 1) * np.cos(2 * k * theta)
    c = np.full(n + 1, 2.0)
    c[0] = c[-1] = 1.0
    weights = c * w / n / 2.0  # /2: from [-1, 1] to [0, 1]
    alphas = (1.0 - np.cos(theta)) / 2.0
    alphas[0], alphas[-1] = 0.0, 1.0
    if n % 2 == 0:
        alphas[n // 2] = 0.5
    return alphas, weights


def embedded(rule: str, steps: int) -> tuple[np.ndarray, float] | None:
    """A lower-order rule on the nodes of ``nodes(rule, steps)`` (weights over the same nodes,
    0 where it does not use one) and the divisor d: |Q - Q_low| / d estimates the error of Q
    (the rules and divisors per rule: docs/integration.md, "Fixed rules"). The gauss rule drops
    the middle node(s) to stay symmetric: it then sees the symmetric part of the integrand, the
    only part a symmetric rule gets wrong. None when there is no lower-order rule (m = 1; gauss
    and clenshaw-curtis with m = 2).
    """
    alphas, weights = (t.numpy() for t in nodes(rule, steps))
    m = steps
    if m < 2:
        return None
    low = np.zeros(m)
    if rule in ("right", "left"):
        p = _smallest_factor(m)
        k = np.arange(m) + (1 if rule == "right" else 0)
        low[k % p == 0] = p / m
        return low, float(p - 1)
    if rule == "midpoint":
        odd = _smallest_factor(m, odd=True)
        if odd is not None:
            low[np.arange(m) % odd == (odd - 1) // 2] = odd / m
            return low, float(odd * odd - 1)
        low[0::2] = 2.0 / m
        return low, 1.0
    if rule == "clenshaw-curtis" and (m - 1) % 2 == 0:
        _, half = clenshaw_curtis((m - 1) // 2)
        low[0::2] = half
        return low, 1.0
    keep = np.ones(m, dtype=bool)
    keep[(m - 1) // 2:m // 2 + 1] = False
    if not keep.any():
        return None
    low[keep] = _interpolatory(alphas[keep])
    return low, 1.0


def _smallest_factor(m: int, odd: bool = False) -> int | None:
    for p in range(3 if odd else 2, m + 1, 2 if odd else 1):
        if m % p == 0:
            return p
    return None


def _interpolatory(alphas: np.ndarray) -> np.ndarray:
    """Weights on [0, 1] of the rule that integrates every polynomial of degree < len(alphas)
    exactly at these nodes (solved in the Legendre basis, which keeps it well conditioned)."""
    x = 2.0 * np.asarray(alphas, dtype=np.float64) - 1.0
    v = np.polynomial.legendre.legvander(x, len(x) - 1)  # [node, degree]
    moments = np.zeros(len(x))
    moments[0] = 2.0
    return np.linalg.solve(v.T, moments) / 2.0
