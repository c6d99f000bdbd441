"""Integrated Gradients (Sundararajan et al. 2017) on the word embeddings, by captum:
IG_j = sum_d (e_jd - e'_jd) * integral_0^1 dF(e' + a (e - e'))/de_jd da, baseline e' zero for
the content tokens (special tokens keep their embedding). The Gauss-Legendre rule starts at
``IG_STEPS`` points and doubles (up to ``IG_MAX_STEPS``) until |sum IG - (F(x) - F(baseline))|
<= ``IG_TOL`` x max(|F(x) - F(baseline)|, max_j |IG_j|) (plus a float floor); an example at the
cap is flagged, and every example's error, points and state go to ``runner.notes["ig"]``.
docs/faithfulness.md, the ``ig`` row."""

from __future__ import annotations

import numpy as np

from . import Method, register

IG_STEPS = 20  # the first rule; doubled while the completeness error is above the tolerance
IG_MAX_STEPS = 320
IG_TOL = 1e-3
FLOAT_FLOOR = {"float64": 1e-10, "float32": 1e-5}


def integrated_gradients(runner, ex, steps: int = IG_STEPS) -> tuple[np.ndarray, float]:
    """[n] scores and captum's convergence delta (sum of scores minus F(x) - F(baseline))."""
    import torch
    from captum.attr import IntegratedGradients

    from ...engine import attention
    from ..token_importance import model_inputs

    model = runner.model
    dev = runner.device
    types = model_inputs([ex], dev)  # token_type_ids, where the model takes them, once input_ids are popped
    emb = model.get_input_embeddings()(types.pop("input_ids")).detach()
    content = torch.zeros(ex.n, dtype=torch.bool, device=dev)
    content[torch.as_tensor(ex.content, device=dev)] = True
    baseline = torch.where(content[None, :, None], torch.zeros_like(emb), emb)

    def forward(e):
        work = model(inputs_embeds=e, **{k: v.expand(e.shape[0], -1) for k, v in types.items()}).logits.double()
        return work[:, ex.target] if runner.output == "logit" else torch.softmax(work, -1)[:, ex.target]

    ig = IntegratedGradients(forward)
    with attention.taken_over(model), torch.enable_grad():
        attr, delta = ig.attribute(emb, baselines=baseline, n_steps=int(steps), method="gausslegendre",
                                   internal_batch_size=max(1, min(int(steps), runner.max_tokens // max(ex.n, 1))),
                                   return_convergence_delta=True)
    runner.forwards += int(steps)
    return attr[0].sum(-1).double().cpu().numpy(), float(delta.item())


def within(scores: np.ndarray, delta: float, change: float, tol: float, floor: float) -> bool:
    """The completeness error ``delta`` is small against the example's own scale."""
    scale = max(abs(change), float(np.max(np.abs(scores))) if scores.size else 0.0)
    return abs(delta) <= tol * scale + floor


def adaptive_ig(runner, ex, steps: int = IG_STEPS, max_steps: int = IG_MAX_STEPS, tol: float = IG_TOL) -> np.ndarray:
    """IG with the points doubled until completeness holds to ``tol`` (or ``max_steps`` is
    reached: flagged); the example's error, points and state go to ``runner.notes["ig"]``."""
    dtype = str(next(runner.model.parameters()).dtype).removeprefix("torch.")
    floor = FLOAT_FLOOR.get(dtype, 1e-3)
    while True:
        scores, delta = integrated_gradients(runner, ex, steps)
        change = float(scores.sum() - delta)  # captum's delta is sum(IG) - (F(x) - F(baseline))
        ok = within(scores, delta, change, tol, floor)
        if ok or steps * 2 > max_steps:
            break
        steps *= 2
    notes = getattr(runner, "notes", None)
    if notes is None:
        notes = runner.notes = {}
    notes.setdefault("ig", {})[int(ex.index)] = {"completeness_error": float(delta), "change": change,
                                                 "steps": int(steps), "converged": bool(ok)}
    return scores


def summary(notes: dict) -> dict:
    """The faithfulness report's account of IG's completeness over the examples computed."""
    rows = list(notes.values())
    errors = [abs(r["completeness_error"]) for r in rows]
    return {"tolerance": IG_TOL, "examples": len(rows), "flagged": sum(not r["converged"] for r in rows),
            "max_abs_error": max(errors) if errors else None,
            "max_steps_used": max((r["steps"] for r in rows), default=None),
            "flagged_examples": sorted(i for i, r in notes.items() if not r["converged"])}


register(Method("ig", f"Integrated Gradients on the word embeddings (captum; zero baseline for the content "
                      f"tokens; Gauss-Legendre points from {IG_STEPS}, doubled until completeness holds to "
                      f"{IG_TOL:g} of the example's scale, at most {IG_MAX_STEPS}), summed over dimensions",
                lambda ctx: adaptive_ig(ctx.runner, ctx.ex), kind="gradient", needs=("model",),
                params=lambda s: {"output": s.output, "steps": IG_STEPS, "max_steps": IG_MAX_STEPS, "tol": IG_TOL,
                                  "baseline": "zero"},
                version=2,  # 2: points raised until completeness holds (1: 20 points, unchecked)
                requires=("captum",), default=False, reference="Sundararajan et al. 2017"))
