"""``atp-verified`` (the recommended method; docs/circuits.md, "Which method to use"): AtP with
its least trustworthy heads replaced by their exact patching effect (tiers.verified_estimates),
the negative scores scaled by the c of ``SCALES`` whose curve at ``CHECKED`` is best on the
method's own pairs (``Context.choose``; CMD reads |score|, so c sets how the heads working
against the behaviour interleave). The score is the mean over those pairs, the same for every pair.
"""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register
from .tiers import DISAGREE, VERIFIED, VERIFIED_PASSES, verified_estimates

# the multipliers of the negative scores among which the curve chooses (c = 1: |verified AtP|)
SCALES = (1.0, 0.5, 0.25, 0.001)
# where the curve is read to choose: the k that carry nearly all of CMD's trapezoid width
CHECKED = (0.05, 0.1, 0.2, 0.5)


def interleaved(inner: np.ndarray, c: float) -> np.ndarray:
    """``inner`` with its negative entries multiplied by ``c`` (> 0: the signed order kept)."""
    return np.where(inner < 0, c * inner, inner)


def _atp_verified(ctx) -> np.ndarray:
    _, _, inner = verified_estimates(ctx)
    candidates = [interleaved(inner, c) for c in SCALES]
    i = ctx.choose(candidates, CHECKED)
    ctx.cache["atp-verified scale"] = SCALES[i]  # the choice, for the record
    best = candidates[i]
    return np.broadcast_to(best, (ctx.task.n, *best.shape)).copy()


register(HeadMethod(
    name="atp-verified",
    description=f"AtP with its top {VERIFIED} heads (--verify), every head of the first layer and up to {DISAGREE} "
                f"heads whose gate integral and AtP disagree in sign replaced by their exact patching effect; "
                f"how the heads working against the behaviour interleave with the others by magnitude chosen by the "
                f"curve on the method's own pairs (the signed order, and so Spearman, unchanged)",
    compute=_atp_verified,
    kind="gradient",
    reference="Kramar et al. 2024 (AtP and its verification, AtP*); attattr (the interleaving)",
    passes=lambda s: f"{VERIFIED_PASSES} + up to {len(SCALES) * len(CHECKED)} forwards (the candidates)",
    mlp=True,
))
