"""Exact activation patching, one head at a time: ``m(N) - m(N with head h ablated)`` per
pair (the causal effect itself; what the other rankings are compared with). Each head's
pass starts at its own layer: the layers below it run once for the pair, clean."""

from __future__ import annotations

import numpy as np

from . import HeadMethod, register


def _patching(ctx) -> np.ndarray:
    import torch

    from ...engine import attention

    task = ctx.task
    L, H = task.layers, task.heads
    out = np.zeros((task.n, L, H))
    eye = torch.ones(L * H, L, H, device=task.device)
    eye.view(L * H, L * H)[torch.arange(L * H), torch.arange(L * H)] = 0
    with attention.taken_over(task.model), torch.no_grad():
        for i, b in enumerate(task.batches):
            src = ctx.source(b)
            clean = task.metric(task.logits(b.clean), b)
            for p in range(b.size):
                one = _one(b, p)
                patched = task.gated(one, {l: (v if v.shape[0] == 1 else v[p:p + 1]) for l, v in src.items()},
                                     eye, chunk=max(1, 2048 // b.clean.shape[1]), rows_per_pair=L * H)
                out[b.positions[p]] = (clean[p] - patched).double().cpu().view(L, H).numpy()
            ctx.tick(i + 1, "patching")
    return out


def _one(b, p):
    from .task import PairBatch

    s = slice(p, p + 1)
    return PairBatch([b.positions[p]], b.clean[s], b.counterfactual[s], b.answer[s], b.answer_w[s], b.foil[s], b.foil_w[s])


register(HeadMethod(
    name="patching",
    description="the metric's drop when the head alone is ablated (exact; one pass per head)",
    compute=_patching,
    kind="causal",
    reference="Vig et al. 2020; Wang et al. 2022 (activation patching)",
    passes=lambda s: "1 counterfactual forward + 1 forward per head, batched",
))
