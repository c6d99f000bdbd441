"""``atp-verified``: AtP with its least trustworthy heads replaced by their exact patching
effect, and the circuit's membership chosen on the method's own pairs.

Two measures judge a head ranking, and they read different orders of one score vector s:
Spearman with exact patching (and MIB's CPR) the *signed* order of s, and CMD the order of |s|.
Fixing the signed order fixes the positive heads' order and the negative heads' order; what is
left free is how the two chains interleave by magnitude. So:

* **the signed order** is verified AtP (tiers.verified_estimates): the gradient at the clean
  run (AtP; Kramar et al. 2024) with the exact effect of the ``--verify`` heads of largest
  |AtP| (AtP*'s verification), every head of the first layer (where AtP gets the sign of
  second-order effects wrong) and up to 10 heads whose gate integral and AtP disagree in sign.
  Replacing those heads by their exact values, and nothing else, is what held rank agreement on
  tasks no rule was tuned on;
* **the interleaving** (which heads CMD's circuit keeps first) is one of ``SCALES``: every
  negative score multiplied by c, from c = 1 (plain |verified AtP|) down to c = 0.001 (every
  head that helps the behaviour before any that works against it). The one chosen is the
  curve's nearest to 1 at ``CHECKED`` on the pairs the method is given (with a split: never the
  pairs it is judged on). The signed order, and so Spearman and CPR, is the same for every c.

The score is the mean over the method's pairs (the same for every pair), in units of the
metric for the heads that help the behaviour.
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
