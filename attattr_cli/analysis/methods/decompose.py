"""Vector decompositions of BERT-style (post-LayerNorm) encoders: ALTI (Ferrando et al.
2022) and DecompX (Modarressi et al. 2023), in float64 from one clean forward.

Both read BERT's layer layout (``layer.attention.self.{query,key,value}``,
``layer.attention.output.{dense,LayerNorm}``, ``layer.intermediate.dense``,
``layer.output.{dense,LayerNorm}``); DecompX also ``BertForSequenceClassification``'s pooler
and classifier. :func:`bert_style` tells other architectures apart (left out with a reason).

ALTI: per layer c_ij = max(0, ||y_i||_1 - ||y_i - T~_i(x_j)||_1), rows normalised (an all-zero
row becomes c_ii = 1), rollout R = C^L ... C^1, score R[pool, j]. DecompX: every vector kept as
one part per input token, x_i = sum_k x_(i<-k), biases split by AbsDot weights
|z_(<-k) . b| / (sum_k' |z_(<-k') . b| + 1e-12), activations by the line through zero; the score
of token k is its part of the target logit. The full definitions: docs/faithfulness.md, the
``alti`` and ``decompx`` rows of the methods table.
"""

from __future__ import annotations

import numpy as np

from . import Method, register


def _has(obj, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


LAYER_PARTS = ("attention.self.value", "attention.output.dense", "attention.output.LayerNorm",
               "intermediate.dense", "intermediate.intermediate_act_fn", "output.dense", "output.LayerNorm")


def encoder_layers(model):
    from ...models.arch import find_layers

    return find_layers(model)[1]


def bert_style(loaded) -> str | None:
    """None when the model is a BERT-style post-LayerNorm encoder, else why not."""
    if loaded.arch.is_decoder or loaded.arch.is_encoder_decoder:
        return f"written for BERT-style encoders; {loaded.arch.model_type} is not one"
    try:
        layers = encoder_layers(loaded.model)
    except Exception:  # noqa: BLE001 - any failure means: not this layout
        return f"written for BERT-style encoders; no encoder layers found in {loaded.arch.model_type}"
    for part in LAYER_PARTS:
        if not all(_has(layer, part) for layer in layers):
            return f"written for BERT-style encoder layers (attention.output.LayerNorm, ...); {loaded.arch.model_type} has another layout"
    return None


def bert_head(loaded) -> str | None:
    why = bert_style(loaded)
    if why:
        return why
    m = loaded.model
    base = getattr(m, getattr(m, "base_model_prefix", "bert"), None)
    if base is None or getattr(base, "pooler", None) is None or not _has(m, "classifier.weight"):
        return (f"needs BERT's classifier head (pooler dense + tanh, then a linear classifier); "
                f"{type(m).__name__} has another")
    return None


def clean_forward(runner, ex):
    """(hidden states [L+1, n, d], attention [L, H, n, n], logits [C]) in float64."""
    import torch

    from ...engine import attention
    from ..token_importance import model_inputs

    model = runner.model
    record = attention.Record()
    with attention.taken_over(model) as layers, torch.no_grad(), attention.active(record):
        out = model(**model_inputs([ex], runner.device), output_hidden_states=True)
        att = torch.stack([record.probs[("self", i)][0] for i in range(len(layers))]).double()
    runner.forwards += 1
    hs = torch.stack([h[0] for h in out.hidden_states]).double()
    return hs, att, out.logits[0].double()


def _d(t):
    return t.detach().double()


def _ln(ln):
    return _d(ln.weight), _d(ln.bias), float(ln.eps)


def attention_terms(layer, x, a):
    """T [i, j, d]: sum_h A^h_ij W_O^h (W_V^h x_j + b_V^h) + [i = j] x_i, and b_O."""
    import torch

    sa, so = layer.attention.self, layer.attention.output
    heads = a.shape[0]
    v = x @ _d(sa.value.weight).T + _d(sa.value.bias)  # [n, H dh]
    v = v.view(x.shape[0], heads, -1)  # [j, h, e]
    wo = _d(so.dense.weight).view(x.shape[1], heads, -1)  # [d, h, e]
    pv = torch.einsum("jhe,dhe->hjd", v, wo)
    t = torch.einsum("hij,hjd->ijd", a, pv)
    t = t + torch.diag_embed(x.T).permute(1, 2, 0)  # [i, i, :] += x_i
    return t, _d(so.dense.bias)


def alti_matrix(layer, x, a):
    """ALTI's contributions [i, j] of one layer (rows sum to one)."""
    import torch

    t, bo = attention_terms(layer, x, a)
    g, beta, eps = _ln(layer.attention.output.LayerNorm)
    pre = t.sum(1) + bo  # [i, d]
    std = torch.sqrt(pre.var(-1, unbiased=False) + eps)  # [i]
    y = g * (pre - pre.mean(-1, keepdim=True)) / std[:, None] + beta
    tt = g * (t - t.mean(-1, keepdim=True)) / std[:, None, None]
    dist = (y[:, None, :] - tt).abs().sum(-1)  # [i, j]
    c = (y.abs().sum(-1)[:, None] - dist).clamp_min(0.0)
    total = c.sum(-1, keepdim=True)
    eye = torch.eye(c.shape[0], dtype=c.dtype, device=c.device)
    # a row where every term is farther from y_i than y_i is from zero: the token keeps itself
    return torch.where(total > 0, c / torch.where(total > 0, total, torch.ones_like(total)), eye)


def alti(runner, ex) -> np.ndarray:
    hs, att, _ = clean_forward(runner, ex)
    layers = encoder_layers(runner.model)
    r = np.eye(ex.n)
    for li, layer in enumerate(layers):
        r = alti_matrix(layer, hs[li], att[li]).cpu().numpy() @ r
    return r[ex.pool]


# -- DecompX ----------------------------------------------------------------------------------

def share_bias(parts, b):
    """parts [..., K, d] + their AbsDot shares of the bias b ([d], or [..., d] for one bias per
    vector): each part gets |part . b| / (sum_k |part_k . b| + 1e-12) of b, as the authors' code."""
    import torch

    w = torch.einsum("...kd,...d->...k", parts, b.expand(*parts.shape[:-2], b.shape[-1])).abs()
    w = w / (w.sum(-1, keepdim=True) + 1e-12)
    return parts + w.unsqueeze(-1) * b.unsqueeze(-2)


def _linear_parts(parts, linear):
    return share_bias(parts @ _d(linear.weight).T, _d(linear.bias))


def _ln_parts(parts, ln):
    """parts [i, K, d] of the vectors z_i = sum_k parts; the LayerNorm of z_i split."""
    import torch

    g, beta, eps = _ln(ln)
    z = parts.sum(-2)
    std = torch.sqrt(z.var(-1, unbiased=False) + eps)
    lin = g * (parts - parts.mean(-1, keepdim=True)) / std[:, None, None]
    return share_bias(lin, beta)


def _act_parts(parts, fn):
    """f(z) split by the line through 0 and (z, f(z)): the slope f(z) / (z + 1e-12), as the
    authors' zero-origin approximation."""
    z = parts.sum(-2)
    return (fn(z) / (z + 1e-12)).unsqueeze(-2) * parts


def decompx_layer(layer, parts, a, first: bool):
    """One BERT layer on parts [i, K, d]; a [H, n, n]; ``first``: the parts are the embeddings
    (x_(i<-k) = [i = k] e_i), where the value bias goes with its key token's value."""
    import torch

    sa, so = layer.attention.self, layer.attention.output
    heads = a.shape[0]
    n, k, d = parts.shape
    v = parts @ _d(sa.value.weight).T  # [j, K, H e]
    wo_full, b_v, b_o = _d(so.dense.weight), _d(sa.value.bias), _d(so.dense.bias)
    if first:
        v = v + torch.diag_embed(b_v.expand(n, -1).T).permute(1, 2, 0)  # [j, j, :] += b_V
        bias = b_o
    else:
        bias = wo_full @ b_v + b_o
    v = v.view(n, k, heads, -1)  # [j, K, h, e]
    wo = wo_full.view(d, heads, -1)
    pv = torch.einsum("jkhe,dhe->hjkd", v, wo)
    z = share_bias(torch.einsum("hij,hjkd->ikd", a, pv) + parts, bias)
    y = _ln_parts(z, so.LayerNorm)
    u = _linear_parts(y, layer.intermediate.dense)
    f = _act_parts(u, layer.intermediate.intermediate_act_fn)
    o = _linear_parts(f, layer.output.dense)
    return _ln_parts(o + y, layer.output.LayerNorm)


def decompx_logits(runner, ex):
    """[K, C]: each input token's part of each class logit, and the model's logits [C]."""
    import torch

    hs, att, logits = clean_forward(runner, ex)
    model = runner.model
    layers = encoder_layers(model)
    n = ex.n
    parts = torch.diag_embed(hs[0].T).permute(1, 2, 0).contiguous()  # [i, K, d]: e_i at k = i
    with torch.no_grad():
        for li, layer in enumerate(layers):
            parts = decompx_layer(layer, parts, att[li], first=li == 0)
        base = getattr(model, model.base_model_prefix)
        pooled = _linear_parts(parts[ex.pool][None], base.pooler.dense)  # [1, K, d]
        pooled = _act_parts(pooled, torch.tanh)
        out = _linear_parts(pooled, model.classifier)[0]  # [K, C]
    assert out.shape[0] == n
    return out, logits


def decompx(runner, ex) -> np.ndarray:
    out, _ = decompx_logits(runner, ex)
    return out[:, ex.target].cpu().numpy()


register(Method("alti", "ALTI (Ferrando et al. 2022): L1 contributions of each token to the attention block's "
                        "LayerNorm output, rollout over layers, the pooled row",
                lambda ctx: alti(ctx.runner, ctx.ex), kind="decomposition", needs=("model",),
                params=lambda s: {"aggregation": "rollout"}, applies=bert_style, default=False,
                reference="Ferrando et al. 2022"))
register(Method("decompx", "DecompX (Modarressi et al. 2023): each token's part of the target logit, decomposed "
                           "through every layer (attention, LayerNorm, feed-forward) and the classifier head",
                lambda ctx: decompx(ctx.runner, ctx.ex), kind="decomposition", needs=("model",), params=lambda s: {"output": "logit"},
                version=2,  # 2: AbsDot bias split and the value bias folded as the authors' code (1: elementwise)
                applies=bert_head, default=False, reference="Modarressi et al. 2023"))
