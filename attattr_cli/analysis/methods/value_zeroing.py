"""Value zeroing (Mohebbi et al. 2023): in layer l the value vector of token j is zeroed in every
head (done as column j of the attention set to zero, no renormalisation), and
C^l_ij = 1 - cos(x~_i, x~_i^(-j)) between the layer's clean and counterfactual outputs, rows
normalised to sum to one; rollout R = C^L ... C^1, score R[pool, j]. A layer's n
counterfactuals run as one batch through the whole model (``analysis.attention_edit``), only
the layer's own output read. docs/faithfulness.md, the ``value_zeroing`` row."""

from __future__ import annotations

import numpy as np

from . import Method, register


def zero_columns(probs, columns):
    """probs [1 or b, head, q, k]; row b of the batch gets column columns[b] zeroed."""
    import torch

    b = len(columns)
    p = probs.expand(b, *probs.shape[1:]).clone()
    p[torch.arange(b), :, :, torch.as_tensor(columns)] = 0.0
    return p


def value_zeroing_matrices(runner, ex) -> np.ndarray:
    """[layer, n, n] row-normalised value-zeroing contributions C^l."""
    import torch

    from ...engine import attention
    from ..attention_edit import Edit, edited
    from ..token_importance import model_inputs

    model = runner.model
    n = ex.n
    inputs = model_inputs([ex], runner.device)

    def run(batch):
        return model(**{k: v.expand(batch, -1) for k, v in inputs.items()}, output_hidden_states=True).hidden_states

    with attention.taken_over(model), torch.no_grad():
        clean = run(1)
    num_layers = len(clean) - 1
    out = np.zeros((num_layers, n, n))
    cols = list(range(n))
    per = max(1, runner.max_tokens // max(n, 1))  # counterfactuals per batch
    for layer in range(num_layers):
        parts = []
        for start in range(0, n, per):
            chunk = cols[start:start + per]
            with edited(model, Edit(layer, lambda p, c=chunk: zero_columns(p, c))), torch.no_grad():
                parts.append(run(len(chunk))[layer + 1].double())
            runner.forwards += len(chunk)
        x = clean[layer + 1][0].double()  # [n, d]
        xz = torch.cat(parts)  # [j, i, d]
        cos = torch.nn.functional.cosine_similarity(xz, x[None].expand_as(xz), dim=-1)  # [j, i]
        c = (1.0 - cos).T.clamp_min(0.0).cpu().numpy()  # [i, j]
        s = c.sum(-1, keepdims=True)
        out[layer] = np.where(s > 0, c / np.where(s > 0, s, 1.0), np.eye(n))
    return out


def rollout_of(matrices: np.ndarray) -> np.ndarray:
    """R = C^L ... C^1."""
    r = np.eye(matrices.shape[-1])
    for c in matrices:
        r = c @ r
    return r


def value_zeroing(runner, ex) -> np.ndarray:
    return rollout_of(value_zeroing_matrices(runner, ex))[ex.pool]


register(Method("value_zeroing", "value zeroing (Mohebbi et al. 2023): cosine distance of each layer's output when "
                                 "a token's values are zeroed, rows normalised, rollout over layers, the pooled row",
                lambda ctx: value_zeroing(ctx.runner, ctx.ex), kind="decomposition", needs=("model",),
                params=lambda s: {"aggregation": "rollout"}, default=False, reference="Mohebbi et al. 2023"))
