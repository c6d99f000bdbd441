"""Quadrature rules for the path integral over alpha in [0, 1] (docs/method.md section 1.2)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import OptionError

RULES = {
    "right": "right Riemann sum, alpha = k/m for k = 1..m (the paper)",
    "left": "left Riemann sum, alpha = k/m for k = 0..m-1 (the 2021 reference code)",
    "midpoint": "midpoint rule, alpha = (k - 1/2)/m",
    "gauss": "Gauss-Legendre quadrature with m nodes (exact for polynomials of degree 2m-1)",
}


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
    else:
        raise OptionError(f"unknown rule '{rule}'; available: {', '.join(RULES)}")
    return torch.from_numpy(alphas), torch.from_numpy(weights)
