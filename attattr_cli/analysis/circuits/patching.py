"""Exact activation patching, one head at a time: ``m(N) - m(N with head h ablated)`` per
pair (the causal effect itself; what the other rankings are compared with). The rows of a
pass patch the heads of one layer; the layers below it are not recomputed (their clean
output is replayed), so a pass costs the layers from its own up."""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register


def _patching(ctx, part: str = "output", heads: dict | None = None) -> np.ndarray:
    """[pairs, layer, head] exact effects; with ``heads`` ({layer: [head, ...]}) only those heads
    are patched (the others stay 0)."""
    import torch

    from ...engine import attention
    from .task import rows_of

    task = ctx.task
    L, H = task.layers, task.width  # with MLP nodes, column task.heads is the layer's MLP
    if part != "output":
        H = task.heads
    todo = {l: list(range(H)) for l in range(L)} if heads is None else {l: list(h) for l, h in heads.items() if h}
    out = np.zeros((task.n, L, H))
    with task.over(), torch.no_grad():
        for i, b in enumerate(task.batches):
            src = ctx.source(b) if part == "output" else ctx.part_source(b, part)
            clean_logits, below = task.layer_outputs(b.clean)  # one clean forward: the metric and the replay
            clean = task.metric(clean_logits, b)
            for l in sorted(todo):
                hs = torch.tensor(todo[l], device=task.device)
                per_pass = max(1, 256 // len(hs))  # pairs per pass
                for s in range(0, b.size, per_pass):
                    pos = torch.arange(s, min(b.size, s + per_pass), device=task.device)
                    owner = pos.repeat_interleave(len(hs))
                    rows_heads = hs.repeat(len(pos))
                    gate = torch.ones(len(owner), L, H, dtype=task.dtype, device=task.device)
                    gate[torch.arange(len(owner)), l, rows_heads] = 0
                    here = {k: v for k, v in src.items() if k == l or k == ("mlp", l)}  # layer l's heads and MLP
                    plan = attention.HeadPatch(source=rows_of(here, owner), gate=gate)
                    m = task.metric(task.from_layer(l, below, b.clean, owner, plan), b.take(owner))
                    eff = (clean[owner] - m).view(len(pos), len(hs)).double().cpu().numpy()
                    for j, h in enumerate(todo[l]):
                        out[[b.positions[p] for p in pos.tolist()], l, h] = eff[:, j]
            ctx.tick(i + 1, "patching" if part == "output" else f"patching-{part}")
    return out


def patched_heads(ctx, heads: list) -> np.ndarray:
    """Exact patching effects of only ``heads`` ([(layer, head), ...]): [pairs, layer, head], 0
    elsewhere (one pass per head, batched)."""
    by_layer: dict = {}
    for l, h in heads:
        by_layer.setdefault(int(l), []).append(int(h))
    return _patching(ctx, heads=by_layer)


register(HeadMethod(
    name="patching",
    description="the metric's drop when the head alone is ablated (exact; one pass per head)",
    compute=_patching,
    kind="causal",
    reference="Vig et al. 2020; Wang et al. 2022 (activation patching)",
    passes=lambda s: "1 counterfactual forward + 1 forward per head, batched",
    mlp=True,
))
for part, noun, what in (("pattern", "pattern", "where the head looks: its output becomes A' V (the counterfactual's pattern, "
                                "the clean values)"),
                   ("values", "value", "what the head reads: its output becomes A V' (the clean pattern, the "
                               "counterfactual's values)")):
    register(HeadMethod(
        name=f"patching-{part}",
        description=f"exact patching of only {what}",
        compute=lambda ctx, part=part: _patching(ctx, part),
        kind="causal",
        reference=f"attattr (the {noun} part of activation patching)",
        passes=lambda s: "2 recording forwards + 1 forward per head, batched",
    ))
