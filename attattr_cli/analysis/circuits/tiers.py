"""``attr-tiers``: a ranking built for both of MIB's questions at once, the circuit's curve (CMD)
and agreement with one-head-at-a-time patching (Spearman).

MIB's curve only asks which heads are in the top ``int(k N)`` for each k, and with trapezoids
on a linear k scale its area is set by the sets at 10, 20 and 50 %: reordering heads inside
one of the tiers [0, 10 %), [10, 20 %), [20, 50 %), [50, 100 %] changes the curve only below
10 % and not CMD's larger terms. A Spearman correlation over all N heads is set by the order of
the many heads, hardly by the top few. So:

* **which tier** a head is in comes from ``attr-gates`` (integrated gradients along the head
  gates from all ablated to all kept: the state the curve's circuits live in);
* **the order inside a tier** comes from the gradient at the clean run (AtP, the same batch of
  passes with one node more, at alpha = 1) with the ``VERIFIED`` heads of largest |AtP|
  replaced by their exact patching effect (one pass per head: AtP*'s verification step, Kramar
  et al. 2024).

The score is a signed rank (N for the first head, 1 for the last; the sign is that of the
verified AtP value), the same for every pair: the ranking is built from the means over pairs.
"""

from __future__ import annotations

import numpy as np

from .evaluate import PERCENTAGES
from .gates import STEPS, gate_gradients, nodes
from .patching import patched_heads
from .registry import HeadMethod, register

VERIFIED = 20  # heads of largest |AtP| whose exact patching effect replaces AtP's (docs/circuits.md)
TIERS = (0.1, 0.2, 0.5)  # the curve's k where the tiers end (CMD's largest trapezoids)


def tiered(member: np.ndarray, inner: np.ndarray, ends=TIERS) -> np.ndarray:
    """Signed ranks [layer, head]: heads in tiers by |member| (ending at ``int(k N)`` for k in
    ``ends``), inside a tier by |inner|; the sign of ``inner`` (0 counts as +)."""
    shape = member.shape
    m, v = np.abs(member.ravel()), inner.ravel()
    n = m.size
    by_member = np.argsort(-m, kind="stable")
    bounds = [0] + [int(k * n) for k in ends] + [n]
    order = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = by_member[a:b]
        order.extend(seg[np.argsort(-np.abs(v[seg]), kind="stable")].tolist())
    rank = np.zeros(n)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(n, 0, -1, dtype=float)
    sign = np.where(v < 0, -1.0, 1.0)
    return (rank * sign).reshape(shape)


def _attr_tiers(ctx) -> np.ndarray:
    x, w = nodes(ctx.steps or STEPS)
    alphas = np.concatenate([x, [1.0]])
    weights = np.stack([np.concatenate([w, [0.0]]), np.concatenate([np.zeros_like(w), [1.0]])], axis=1)
    ig, atp = gate_gradients(ctx, alphas, weights)  # one batch of passes: the integral and the clean gradient
    ig_mean, atp_mean = ig.mean(0), atp.mean(0)
    flat = np.abs(atp_mean.ravel())
    top = np.argsort(-flat, kind="stable")[:min(VERIFIED, flat.size)]
    heads = [divmod(int(i), atp_mean.shape[1]) for i in top]
    exact = patched_heads(ctx, heads).mean(0)
    inner = atp_mean.copy()
    for l, h in heads:
        inner[l, h] = exact[l, h]
    ranks = tiered(ig_mean, inner)
    return np.broadcast_to(ranks, (ctx.task.n, *ranks.shape)).copy()


assert TIERS == tuple(k for k in PERCENTAGES if k in TIERS)  # the tiers end where the curve is read

register(HeadMethod(
    name="attr-tiers",
    description=f"heads in the curve's tiers (10, 20, 50 %) by attr-gates, ordered inside a tier by AtP with its "
                f"top {VERIFIED} verified by exact patching (a signed rank)",
    compute=_attr_tiers,
    kind="attribution",
    reference="attattr (attr-gates for the tiers; AtP and its verification, Kramar et al. 2024)",
    passes=lambda s: f"1 counterfactual forward + (steps + 1) forward and backward rows + {VERIFIED} forwards (patching)",
    mlp=True,
))
