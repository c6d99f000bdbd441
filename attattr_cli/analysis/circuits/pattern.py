"""attattr's attention attribution as head rankings: one layer's attention pattern moved along
a path while every other layer computes its own.

* ``attr``: the paper's path ``A(alpha) = alpha A``; a head's score the max over the map of
  ``Attr_h = A_h . int dF/dA_h``, F the pair's metric.
* ``attr-cf``: the counterfactual path ``A(alpha) = A' + alpha (A - A')``, A' the counterfactual
  run's pattern of the layer, ``Attr_h = (A_h - A'_h) . int dF/dA_h`` summed over the map; a
  layer's scores add up to F(clean) - F(that layer's pattern from the counterfactual).

Both integrate with a fixed Gauss-Legendre rule (``steps`` nodes); a pass holds one layer's
nodes for several pairs, the layers below replayed from the clean run. docs/circuits.md, "The
methods" and "Why an attention-only ranking cannot agree with patching here".
"""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register
from .gates import nodes

STEPS = 4


def pattern_attribution(ctx, counterfactual: bool, reduce: str) -> np.ndarray:
    """[pairs, layer, head]: each head's map reduced by its max or its sum; both reductions come
    from one integral, made once per context and path."""
    key = ("pattern", counterfactual)
    if key not in ctx.cache:
        ctx.cache[key] = _pattern_maps(ctx, counterfactual)
    return ctx.cache[key][reduce]


def _pattern_maps(ctx, counterfactual: bool) -> dict:
    """Every pair's and layer's map by the engine's integral (engine/layer_integral.py's
    node_sum: the rows of a pass are the nodes of several pairs), reduced per head."""
    import torch

    from ...engine import attention
    from ...engine.layer_integral import node_sum

    task = ctx.task
    L, H = task.layers, task.heads
    x, w = nodes(ctx.steps or STEPS)
    alphas, weights = torch.tensor(x, dtype=task.dtype, device=task.device), torch.from_numpy(w)
    out = {"max": np.zeros((task.n, L, H)), "sum": np.zeros((task.n, L, H))}
    with task.over():
        for i, b in enumerate(task.batches):
            if counterfactual:
                _, _, cf_probs = task.record(b.counterfactual, want_probs=True)
            _, below = task.layer_outputs(b.clean)
            per_pass = max(1, 64 // len(x))  # pairs per pass
            for s in range(0, b.size, per_pass):
                pos = torch.arange(s, min(b.size, s + per_pass), device=task.device)
                for l in range(L):
                    def run(owner, alpha, wt, l=l):  # the maps' rows: (A - A') dM/dA(row) w
                        owner = pos[owner.to(task.device)]
                        source = {l: cf_probs[l][owner] if counterfactual else torch.zeros(1, dtype=task.dtype,
                                                                                             device=task.device)}
                        plan = attention.PatternPath(target=torch.full((len(owner),), l, device=task.device),
                                                     alpha=alpha, source=source)
                        with torch.enable_grad():
                            m = task.metric(task.from_layer(l, below, b.clean, owner, plan), b.take(owner))
                            (g,) = torch.autograd.grad(m.sum(), plan.leaves[l])
                        yield slice(None), plan.delta[l] * g * wt.view(-1, 1, 1, 1), m.detach()

                    attr = node_sum(run, len(pos), alphas, weights, task.dtype, task.device, summed=True)[0].flatten(2)
                    rows = [b.positions[p] for p in pos.tolist()]
                    out["max"][rows, l] = attr.max(-1).values.double().cpu().numpy()
                    out["sum"][rows, l] = attr.sum(-1).double().cpu().numpy()
            ctx.tick(i + 1, "attr-cf" if counterfactual else "attr")
    return out


ROWS = "(layers x steps) forward and backward rows per pair"
for name, counterfactual, reduce, description in (
        ("attr", False, "max", "the paper's attention attribution (zero-attention baseline), max over the head's map"),
        ("attr-sum", False, "sum", "the paper's attention attribution (zero-attention baseline), summed over the head's"
                                   " map"),
        ("attr-cf", True, "sum", "attention attribution along the path from the counterfactual run's pattern to the"
                                 " clean one, summed over the head's map")):
    register(HeadMethod(
        name=name, description=description, kind="attribution",
        compute=lambda ctx, cf=counterfactual, r=reduce: pattern_attribution(ctx, counterfactual=cf, reduce=r),
        reference="attattr (Hao et al. 2021 with a counterfactual baseline)" if counterfactual else "Hao et al. 2021",
        passes=lambda s, cf=counterfactual: ("1 counterfactual forward + " if cf else "") + ROWS,
    ))
