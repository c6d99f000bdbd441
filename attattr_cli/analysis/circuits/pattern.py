"""attattr's attention attribution as head rankings: one layer's attention pattern moved along
a path while every other layer computes its own (docs/method.md).

* ``attr``: the paper's path from zero attention, ``A(alpha) = alpha A``, head importance the
  max over the map of ``Attr_h = A_h . int dF/dA_h``, F the pair's metric.
* ``attr-cf``: the counterfactual path ``A(alpha) = A' + alpha (A - A')`` with A' the
  counterfactual run's pattern of the same layer, ``Attr_h = (A_h - A'_h) . int dF/dA_h``;
  a head's score is the sum over its map, and a layer's scores add up to
  F(clean) - F(that layer's pattern taken from the counterfactual) (completeness). It
  measures what the head's *pattern* change does; what changes in its values (the
  counterfactual's names themselves) is left out, and that is where it differs from patching.

Both integrate with a fixed Gauss-Legendre rule (``steps`` nodes, 4 by default); each row of
a pass scores one (layer, node), so a pair's layers and nodes run as one batch.
"""

from __future__ import annotations

import numpy as np

from . import HeadMethod, register
from .gates import nodes

STEPS = 4


def pattern_attribution(ctx, counterfactual: bool, reduce: str) -> np.ndarray:
    import torch

    from ...engine import attention

    task = ctx.task
    L, H = task.layers, task.heads
    x, w = nodes(ctx.steps or STEPS)
    k = len(x)
    out = np.zeros((task.n, L, H))
    with attention.taken_over(task.model):
        for i, b in enumerate(task.batches):
            if counterfactual:
                _, _, cf_probs = task.record(b.counterfactual, want_probs=True)
            for p in range(b.size):
                rows = L * k
                target = torch.arange(L, device=task.device).repeat_interleave(k)
                alpha = torch.tensor(x, dtype=task.dtype, device=task.device).repeat(L)
                if counterfactual:
                    source = {l: cf_probs[l][p:p + 1] for l in range(L)}
                else:
                    source = {l: torch.zeros(1, device=task.device) for l in range(L)}
                plan = attention.PatternPath(target=target, alpha=alpha, source=source)
                idx = torch.full((rows,), p, device=task.device)
                from .gates import _rows

                with torch.enable_grad():
                    m = task.metric(task.logits(b.clean[idx], plan), _rows(b, idx))
                    grads = torch.autograd.grad(m.sum(), [plan.leaves[l] for l in range(L)])
                wt = torch.tensor(w, dtype=grads[0].dtype, device=task.device).view(k, 1, 1, 1)
                for l in range(L):
                    attr = plan.delta[l][0] * (grads[l] * wt).sum(0)  # [head, q, k]
                    v = attr.flatten(1).max(1).values if reduce == "max" else attr.flatten(1).sum(1)
                    out[b.positions[p], l] = v.double().cpu().numpy()
            ctx.tick(i + 1, "attr-cf" if counterfactual else "attr")
    return out


register(HeadMethod(
    name="attr",
    description="the paper's attention attribution (zero-attention baseline), max over the head's map",
    compute=lambda ctx: pattern_attribution(ctx, counterfactual=False, reduce="max"),
    kind="attribution",
    reference="Hao et al. 2021",
    passes=lambda s: "(layers x steps) forward and backward rows per pair",
))
register(HeadMethod(
    name="attr-sum",
    description="the paper's attention attribution (zero-attention baseline), summed over the head's map",
    compute=lambda ctx: pattern_attribution(ctx, counterfactual=False, reduce="sum"),
    kind="attribution",
    reference="Hao et al. 2021",
    passes=lambda s: "(layers x steps) forward and backward rows per pair",
))
register(HeadMethod(
    name="attr-cf",
    description="attention attribution along the path from the counterfactual run's pattern to the clean one, "
                "summed over the head's map",
    compute=lambda ctx: pattern_attribution(ctx, counterfactual=True, reduce="sum"),
    kind="attribution",
    reference="attattr (Hao et al. 2021 with a counterfactual baseline)",
    passes=lambda s: "1 counterfactual forward + (layers x steps) forward and backward rows per pair",
))
