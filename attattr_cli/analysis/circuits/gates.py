"""Head gates: every head's output written ``z' + g (z - z')`` between its ablated value z'
and its live value z; g = 1 everywhere is the clean model (m(N)), g = 0 every head ablated
(m(empty)). ``atp`` reads ``dF/dg_h`` at g = 1 (``<dm/dz_h, z_h - z'_h>``); ``attr-gates``
integrates it along g = alpha 1 (Gauss-Legendre nodes), ``IG_h = int_0^1 dF/dg_h(alpha 1) d
alpha``, whose scores add up to ``m(N) - m(empty)``. docs/circuits.md, "The methods".
"""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register

STEPS = 4  # Gauss-Legendre nodes of the diagonal (docs/circuits.md: how many are enough)


def nodes(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [0, 1]."""
    x, w = np.polynomial.legendre.leggauss(k)
    return (x + 1) / 2, w / 2


def gate_gradients(ctx, alphas, weights) -> np.ndarray:
    """sum_k weights[k] * dF/dg (alphas[k] * 1) per pair: [pairs, layer, head]; with
    ``weights`` [k, m] (m sums of the same passes) [m, pairs, layer, head]."""
    import torch

    from ...engine import attention
    from .task import rows_of

    task = ctx.task
    L, H = task.layers, task.width  # the nodes of a layer: its heads (and its MLP)
    k = len(alphas)
    w = torch.tensor(np.asarray(weights), dtype=torch.float64)
    several = w.dim() == 2
    w = w if several else w.view(k, 1)
    out = np.zeros((w.shape[1], task.n, L, H))
    a = torch.tensor(np.asarray(alphas), dtype=task.dtype, device=task.device)
    with task.over():
        for i, b in enumerate(task.batches):
            src = ctx.source(b)
            per_chunk = max(1, 64 // k)  # pairs per pass
            for s in range(0, b.size, per_chunk):
                pos = list(range(s, min(b.size, s + per_chunk)))
                rows = len(pos) * k
                idx = torch.tensor(pos, device=task.device).repeat_interleave(k)
                gate = a.repeat(len(pos)).view(rows, 1, 1).expand(rows, L, H).clone().requires_grad_(True)
                plan = attention.HeadPatch(source=rows_of(src, idx), gate=gate)
                with torch.enable_grad():
                    logits = task.logits(b.clean[idx], plan)
                    m = task.metric(logits, b.take(idx))
                    (g,) = torch.autograd.grad(m.sum(), gate)
                g = g.detach().double().cpu().view(len(pos), k, L, H)
                for j in range(w.shape[1]):
                    out[j, [b.positions[p] for p in pos]] = (g * w[:, j].view(1, k, 1, 1)).sum(1).numpy()
            ctx.tick(i + 1, "gates")
    return out if several else out[0]


def _attr_gates(ctx) -> np.ndarray:
    x, w = nodes(ctx.steps or STEPS)
    return gate_gradients(ctx, x, w)


register(HeadMethod(
    name="attr-gates",
    description="integrated gradients of the metric along head gates from all heads ablated to all kept "
                "(the scores add up to m(N) - m(empty))",
    compute=_attr_gates,
    kind="attribution",
    reference="attattr (integrated gradients, Sundararajan et al. 2017, over MIB's node gates)",
    passes=lambda s: "1 counterfactual forward + (steps) forward and backward rows, batched",
    default=True,
    complete=True,
    mlp=True,
))
