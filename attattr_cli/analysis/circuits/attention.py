"""Raw attention as a head ranking: the attention the last position (where the answer is
predicted) pays to the prompt's occurrence of the answer token (IOI: the indirect object),
or, where the answer does not occur in the prompt, its largest attention to any token but
the first (which many models use as a sink)."""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register


def _attention(ctx) -> np.ndarray:
    import torch

    task = ctx.task
    out = np.zeros((task.n, task.layers, task.heads))
    with task.over(), torch.no_grad():
        for i, b in enumerate(task.batches):
            _, _, probs = task.record(b.clean, want_probs=True)
            for p in range(b.size):
                ids = b.clean[p]
                where = torch.isin(ids, b.answer[p]).nonzero().flatten()
                for l in range(task.layers):
                    last = probs[l][p, :, -1]  # [head, key]
                    v = last[:, where].sum(-1) if where.numel() else last[:, 1:].max(-1).values
                    out[b.positions[p], l] = v.double().cpu().numpy()
            ctx.tick(i + 1, "attention")
    return out


register(HeadMethod(
    name="attention",
    description="attention from the last position to the answer's occurrence in the prompt (else its largest)",
    compute=_attention,
    kind="attention",
    reference="Jain & Wallace 2019 (raw attention as explanation)",
    passes=lambda s: "1 forward",
))
