"""``attr-tiers``: a ranking for both of MIB's questions at once, the circuit's curve (CMD) and
agreement with one-head-at-a-time patching (Spearman). A head's tier ([0, 10 %), [10, 20 %),
[20, 50 %), [50, 100 %]) comes from ``attr-gates``, the order inside a tier from verified AtP
(:func:`verified_estimates`: ``VERIFIED`` heads of largest |AtP|, the first ``EXACT_LAYERS``
layers and up to ``DISAGREE`` sign disagreements patched exactly), the first tier is the better
of two candidates at ``CHECKED`` (``Context.choose``). The score is a signed rank (N for the
first head, 1 for the last, signed as verified AtP), the same for every pair.
docs/circuits.md, "How `attr-tiers` was built".
"""

from __future__ import annotations

import numpy as np

from .gates import STEPS, gate_gradients, nodes
from .patching import patched_heads
from .registry import HeadMethod, register

VERIFIED = 15  # heads of largest |AtP| whose exact patching effect replaces AtP's (docs/circuits.md)
# the first layers, whose every head's exact patching effect replaces AtP's: a head's change there
# goes through every layer above, and the gradient at the clean run is furthest from patching
# (docs/circuits.md: most of AtP's rank error on SmolLM2 is in layer 0)
EXACT_LAYERS = 1
# heads whose gate integral and AtP disagree in sign, largest |gate integral| first, whose exact
# patching effect replaces AtP's too: the two estimates of one head pointing opposite ways is the
# mark of the nonlinearity AtP misses (docs/circuits.md: IOI's head 16.0, AtP -0.27, patching +1.4)
DISAGREE = 10
# what verified_estimates costs per pair (shared by the methods that read it)
VERIFIED_PASSES = (f"1 counterfactual forward + (steps + 1) forward and backward rows + up to {VERIFIED} + {DISAGREE} + "
                   "(heads per layer) forwards (patching)")
TIERS = (0.1, 0.2, 0.5)  # the curve's k where the tiers end (CMD's largest trapezoids)


# the curve's k where the candidates are measured: the two of the first tier that CMD weighs most
CHECKED = (0.05, 0.1)
# the candidates for the first tier: (its order, its heads by the signed member instead of |member|)
FIRST = (("sign", True), ("greedy", False))


def tiered(member: np.ndarray, inner: np.ndarray, ends=TIERS, first: str = "magnitude", signed_first: bool = False,
           additive: np.ndarray | None = None) -> np.ndarray:
    """Signed ranks [layer, head]: heads in tiers by |member| (ending at ``int(k N)`` for k in
    ``ends``), inside a tier by |inner|; the sign of ``inner`` (0 counts as +).
    ``signed_first``: the first tier's heads are those of largest member (signed), the other
    tiers' by |member| among the rest. ``first`` orders the first tier otherwise than by
    |inner|: ``sign`` by inner (largest first), ``greedy`` each next head the one whose
    ``additive`` share (default: member) brings the running sum nearest the sum over all heads
    (ties by |inner|)."""
    shape = member.shape
    m, v = np.abs(member.ravel()), inner.ravel()
    n = m.size
    by_member = np.argsort(-m, kind="stable")
    if signed_first and ends:
        head = np.argsort(-member.ravel(), kind="stable")[:int(ends[0] * n)]
        by_member = np.concatenate([head, by_member[~np.isin(by_member, head)]])
    bounds = [0] + [int(k * n) for k in ends] + [n]
    order = []
    for t, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        seg = by_member[a:b]
        if t == 0 and first == "sign":
            order.extend(seg[np.argsort(-v[seg], kind="stable")].tolist())
        elif t == 0 and first == "greedy":
            order.extend(_greedy(seg, (member if additive is None else additive).ravel(), v))
        else:
            order.extend(seg[np.argsort(-np.abs(v[seg]), kind="stable")].tolist())
    rank = np.zeros(n)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(n, 0, -1, dtype=float)
    sign = np.where(v < 0, -1.0, 1.0)
    return (rank * sign).reshape(shape)


def verified_estimates(ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gate integral, AtP, verified AtP), each the mean over ``ctx``'s pairs [layer, node]:
    the gate integral and AtP from one batch of passes (AtP is the integrand at alpha = 1), and
    verified AtP is AtP with the exact patching effect of its ``--verify`` heads of largest
    |AtP|, every head of the first ``EXACT_LAYERS`` layers and up to ``DISAGREE`` heads whose
    two estimates disagree in sign. Computed once per context (every method that reads them
    shares the passes)."""
    if "verified" not in ctx.cache:
        x, w = nodes(ctx.steps or STEPS)
        alphas = np.concatenate([x, [1.0]])
        weights = np.stack([np.concatenate([w, [0.0]]), np.concatenate([np.zeros_like(w), [1.0]])], axis=1)
        ig, atp = gate_gradients(ctx, alphas, weights)  # one batch of passes: the integral and the clean gradient
        ig_mean, atp_mean = ig.mean(0), atp.mean(0)
        flat = np.abs(atp_mean.ravel())
        top = np.argsort(-flat, kind="stable")[:min(verified_count(ctx), flat.size)]
        first_layers = range(min(EXACT_LAYERS, atp_mean.shape[0]) * atp_mean.shape[1])  # flat indices, layer-major
        verified = dict.fromkeys([*top.tolist(), *first_layers, *disagreeing(ig_mean, atp_mean, DISAGREE).tolist()])
        heads = [divmod(int(i), atp_mean.shape[1]) for i in verified]
        exact = patched_heads(ctx, heads).mean(0)
        inner = atp_mean.copy()
        for l, h in heads:
            inner[l, h] = exact[l, h]
        ctx.cache["verified"] = (ig_mean, atp_mean, inner)
    return ctx.cache["verified"]


def _attr_tiers(ctx) -> np.ndarray:
    ig_mean, _, inner = verified_estimates(ctx)
    candidates = [tiered(ig_mean, inner, first=first, signed_first=signed) for first, signed in FIRST]
    ranks = candidates[ctx.choose(candidates, CHECKED)]
    return np.broadcast_to(ranks, (ctx.task.n, *ranks.shape)).copy()


def verified_count(ctx) -> int:
    """Heads of largest |AtP| verified by exact patching: ``--verify`` where given, else ``VERIFIED``."""
    return VERIFIED if ctx.verify is None else int(ctx.verify)


def disagreeing(ig: np.ndarray, atp: np.ndarray, count: int) -> np.ndarray:
    """Flat indices of up to ``count`` heads whose gate integral and AtP have opposite signs,
    largest |gate integral| first."""
    flat_ig, flat_atp = ig.ravel(), atp.ravel()
    order = np.argsort(-np.abs(flat_ig), kind="stable")
    return order[np.sign(flat_ig[order]) * np.sign(flat_atp[order]) < 0][:count]


def _greedy(seg: np.ndarray, share: np.ndarray, inner: np.ndarray) -> list[int]:
    """``seg``'s heads in the order that keeps the running sum of their shares nearest the sum
    of all shares (ties: the larger |inner| first)."""
    total, run, left, out = float(share.sum()), 0.0, [int(i) for i in seg], []
    while left:
        j = min(range(len(left)), key=lambda j: (abs(total - run - share[left[j]]), -abs(inner[left[j]])))
        run += float(share[left[j]])
        out.append(left.pop(j))
    return out


register(HeadMethod(
    name="attr-tiers",
    description=f"heads in the curve's tiers (10, 20, 50 %) by attr-gates, ordered inside a tier by AtP with its "
                f"top {VERIFIED}, every head of the first layer and up to {DISAGREE} heads whose gate integral and AtP "
                f"disagree in sign verified by exact patching; the first tier the better of two candidates as the "
                f"curve measures them (a signed rank)",
    compute=_attr_tiers,
    kind="attribution",
    reference="attattr (attr-gates for the tiers; AtP and its verification, Kramar et al. 2024)",
    passes=lambda s: f"{VERIFIED_PASSES} + up to {len(FIRST) * len(CHECKED)} forwards (the candidates)",
    mlp=True,
))
