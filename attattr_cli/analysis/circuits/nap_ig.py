"""EAP-IG-inputs at node level ("NAP-IG"; Hanna et al. 2024, as MIB evaluates it):
integrated gradients along the input-embedding path from the counterfactual prompt to the
clean one, read at every head's output: ``sum_k dm/dz_h(alpha_k) . (z_h - z'_h) / steps``
with alpha_k = k / steps, k = 1..steps (EAP-IG's 5 steps by default)."""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register


def _nap_ig(ctx) -> np.ndarray:
    import torch

    from ...engine import attention
    from .task import rows_of

    task = ctx.task
    L, H = task.layers, task.width
    steps = ctx.steps or 5  # EAP-IG's default
    out = np.zeros((task.n, L, H))
    emb = task.model.get_input_embeddings()
    alphas = torch.arange(1, steps + 1, dtype=torch.float32, device=task.device) / steps
    with task.over():
        for i, b in enumerate(task.batches):
            src = ctx.source(b)
            _, clean_z, _ = task.record(b.clean)
            with torch.no_grad():
                e_clean, e_cf = emb(b.clean), emb(b.counterfactual)
            for p in range(b.size):
                x = e_cf[p:p + 1] + alphas.view(-1, 1, 1) * (e_clean[p:p + 1] - e_cf[p:p + 1])
                plan = attention.HeadPatch(leaves={})
                idx = torch.full((steps,), p, device=task.device)
                with torch.enable_grad():
                    logits = task.logits(None, plan, inputs_embeds=x)
                    m = task.metric(logits, b.take(idx))
                    keys = list(range(L)) + ([("mlp", l) for l in range(L)] if H > task.heads else [])
                    grads = dict(zip(keys, torch.autograd.grad(m.sum(), [plan.leaves[k] for k in keys])))
                src_p = rows_of(src, slice(p, p + 1))
                for k in keys:
                    d = clean_z[k][p:p + 1] - src_p[k]
                    per = (grads[k].sum(0, keepdim=True) * d).sum((0, 2, 3)).double().cpu().numpy() / steps
                    if isinstance(k, tuple):  # the layer's MLP node: column task.heads
                        out[b.positions[p], k[1], task.heads] = per[0]
                    else:
                        out[b.positions[p], k, :task.heads] = per
            ctx.tick(i + 1, "nap-ig")
    return out


register(HeadMethod(
    name="nap-ig",
    description="integrated gradients along the input embeddings from the counterfactual prompt to the clean one, "
                "read at each head's output (EAP-IG-inputs at node level, 5 steps)",
    compute=_nap_ig,
    kind="gradient",
    reference="Hanna et al. 2024 (EAP-IG); Mueller et al. 2025 (MIB)",
    passes=lambda s: "1 counterfactual forward + 1 clean forward + 5 forward and backward rows",
    default=True,
    mlp=True,
))
