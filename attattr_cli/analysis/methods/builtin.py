"""The methods of the first faithfulness release: attention, rollout, attention x gradient,
attention attribution, gradients, leave-one-out and chance. Pure functions of NumPy arrays
first, then their registry entries."""

from __future__ import annotations

import numpy as np

from ...errors import OptionError
from . import Method, register


def attention_last(attention: np.ndarray, pool: int = 0) -> np.ndarray:
    """``attention``: [layer, head, query, key] probabilities."""
    return np.asarray(attention[-1], dtype=np.float64).mean(0)[pool]


def attention_mean(attention: np.ndarray, pool: int = 0) -> np.ndarray:
    return np.asarray(attention, dtype=np.float64).mean((0, 1))[pool]


def rollout_matrix(attention: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """Abnar & Zuidema (2020): R = Â_L ... Â_1 with Â = (1 - r) mean_h A + r I, rows
    renormalised to sum to one."""
    att = np.asarray(attention, dtype=np.float64)
    n = att.shape[-1]
    eye = np.eye(n)
    r = eye.copy()
    for layer in att:
        a = (1.0 - residual) * layer.mean(0) + residual * eye
        a = a / a.sum(-1, keepdims=True)
        r = a @ r
    return r


def rollout(attention: np.ndarray, pool: int = 0, residual: float = 0.5) -> np.ndarray:
    return rollout_matrix(attention, residual)[pool]


def attn_grad_matrix(attention: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """Chefer et al. (2021), eq. 5-6: Ā_l = mean_h relu(∇A_h ⊙ A_h); R = I; R <- R + Ā_l R
    from the first layer up."""
    att = np.asarray(attention, dtype=np.float64)
    g = np.asarray(grads, dtype=np.float64)
    n = att.shape[-1]
    r = np.eye(n)
    for a, ga in zip(att, g):
        bar = np.maximum(a * ga, 0.0).mean(0)
        r = r + bar @ r
    return r


def attn_grad(attention: np.ndarray, grads: np.ndarray, pool: int = 0) -> np.ndarray:
    return attn_grad_matrix(attention, grads)[pool]


def attr_columns(attribution: np.ndarray) -> np.ndarray:
    """``attribution``: [layer, head, query, key]. Sum over layers, heads and queries."""
    return np.asarray(attribution, dtype=np.float64).sum((0, 1, 2))


def attr_pooled(attribution: np.ndarray, pool: int = 0) -> np.ndarray:
    return np.asarray(attribution, dtype=np.float64).sum((0, 1))[pool]


def random_scores(n: int, seed: int, index: int) -> np.ndarray:
    return np.random.default_rng([int(seed), int(index)]).random(n)


# -- registry entries -------------------------------------------------------------------------

def _output(s):
    return {"output": s.output}


def _attribution(ctx, name):
    a = ctx.attribution
    if a is None or np.asarray(a).size == 0:
        raise OptionError(f"method '{name}' needs attention attribution: score the store with all layers")
    return a


def _attr_params(s):
    so = s.score_options
    if not so:
        return {}
    return {"steps": so.get("steps"), "rule": so.get("rule"), "output": so.get("output")}


register(Method("attention_last", "last layer's attention, mean over heads, the pooled token's row",
                lambda ctx: attention_last(ctx.gradients["attention"], ctx.ex.pool),
                kind="attention", needs=("gradients",), reference="Jain & Wallace 2019"))
register(Method("attention_mean", "attention averaged over layers and heads, the pooled token's row",
                lambda ctx: attention_mean(ctx.gradients["attention"], ctx.ex.pool),
                kind="attention", needs=("gradients",)))
register(Method("rollout", "attention rollout (Abnar & Zuidema 2020), 0.5 A + 0.5 I renormalised, the pooled row",
                lambda ctx: rollout(ctx.gradients["attention"], ctx.ex.pool),
                kind="attention", needs=("gradients",), reference="Abnar & Zuidema 2020"))
register(Method("attn_grad", "gradient-weighted attention rollout (Chefer et al. 2021): R += mean_h relu(dF/dA * A) R",
                lambda ctx: attn_grad(ctx.gradients["attention"], ctx.gradients["attention_grad"], ctx.ex.pool),
                kind="attention", needs=("gradients",), params=_output, reference="Chefer et al. 2021"))
register(Method("attr", "attention attribution summed over layers, heads and query rows (key-token column sums)",
                lambda ctx: attr_columns(_attribution(ctx, "attr")),
                kind="attribution", needs=("attribution",), params=_attr_params, reference="Hao et al. 2021"))
register(Method("attr_cls", "attention attribution summed over layers and heads, the pooled token's row",
                lambda ctx: attr_pooled(_attribution(ctx, "attr_cls"), ctx.ex.pool),
                kind="attribution", needs=("attribution",), params=_attr_params, reference="Hao et al. 2021"))
register(Method("grad", "L2 norm of dF/d(word embedding)",
                lambda ctx: np.linalg.norm(ctx.gradients["embedding_grad"], axis=-1),
                kind="gradient", needs=("gradients",), params=_output))
register(Method("input_x_grad", "sum over dimensions of word embedding * dF/d(word embedding)",
                lambda ctx: (ctx.gradients["embedding"] * ctx.gradients["embedding_grad"]).sum(-1),
                kind="gradient", needs=("gradients",), params=_output))
register(Method("loo", "leave-one-out: drop of the target class probability when the token is erased",
                lambda ctx: ctx.runner.loo(ctx.ex), kind="perturbation", needs=("model",),
                params=lambda s: {"erase": s.erase}))
register(Method("random", "seeded uniform random scores (a baseline)",
                lambda ctx: random_scores(ctx.ex.n, ctx.seed, ctx.ex.index), kind="baseline",
                params=lambda s: {"seed": int(s.seed)}))
