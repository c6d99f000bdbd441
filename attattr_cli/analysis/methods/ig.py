"""Integrated Gradients (Sundararajan et al. 2017) on the word embeddings, by captum.

IG_j = sum_d (e_jd - e'_jd) * integral_0^1 dF(e' + a (e - e'))/de_jd da, with the baseline e'
the zero vector for every content token (special tokens keep their embedding, so the path
only moves the words; position and segment embeddings are added by the model as usual).
The integral is captum's Gauss-Legendre rule with ``IG_STEPS`` points; the score is the sum
over the embedding dimensions (signed, like input x gradient). By completeness the scores
sum to F(x) - F(baseline) up to the rule's error."""

from __future__ import annotations

import numpy as np

from . import Method, register

IG_STEPS = 20


def integrated_gradients(runner, ex, steps: int = IG_STEPS) -> tuple[np.ndarray, float]:
    """[n] scores and captum's convergence delta (sum of scores minus F(x) - F(baseline))."""
    import torch
    from captum.attr import IntegratedGradients

    from ...engine import attention

    model = runner.model
    dev = runner.device
    ids = torch.tensor([list(ex.input_ids)], device=dev)
    tt = None if ex.token_type_ids is None else torch.tensor([list(ex.token_type_ids)], device=dev)
    emb = model.get_input_embeddings()(ids).detach()
    content = torch.zeros(ex.n, dtype=torch.bool, device=dev)
    content[torch.as_tensor(ex.content, device=dev)] = True
    baseline = torch.where(content[None, :, None], torch.zeros_like(emb), emb)

    def forward(e):
        inputs = {"inputs_embeds": e}
        if tt is not None:
            inputs["token_type_ids"] = tt.expand(e.shape[0], -1)
        logits = model(**inputs).logits
        work = logits.double()
        return work[:, ex.target] if runner.output == "logit" else torch.softmax(work, -1)[:, ex.target]

    ig = IntegratedGradients(forward)
    with attention.taken_over(model), torch.enable_grad():
        attr, delta = ig.attribute(emb, baselines=baseline, n_steps=int(steps), method="gausslegendre",
                                   internal_batch_size=max(1, min(int(steps), runner.max_tokens // max(ex.n, 1))),
                                   return_convergence_delta=True)
    runner.forwards += int(steps)
    return attr[0].sum(-1).double().cpu().numpy(), float(delta.item())


register(Method("ig", f"Integrated Gradients on the word embeddings (captum; zero baseline for the content "
                      f"tokens, {IG_STEPS} Gauss-Legendre points), summed over dimensions",
                lambda ctx: integrated_gradients(ctx.runner, ctx.ex)[0], kind="gradient", needs=("model",),
                params=lambda s: {"output": s.output, "steps": IG_STEPS, "baseline": "zero"},
                requires=("captum",), default=False, reference="Sundararajan et al. 2017"))
