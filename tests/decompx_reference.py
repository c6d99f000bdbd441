"""DecompX computed the way its authors' code computes it (their BERT modelling file with the
default configuration: AbsDot bias decomposition, LayerNorms and the feed-forward included,
GeLU and tanh by the zero-origin slope, vector aggregation through the layers, the pooler and
the classifier included), ported by hand to a plain function over a transformers
``BertForSequenceClassification``'s weights, with its own forward pass. It shares no code with
attattr and keeps the authors' layout: attribution vectors ``[batch, i, k, d]`` (token i's
vector, the part from input token k).

Used by the tests only, as the independent reference for ``attattr_cli.analysis.methods.decompose``."""

from __future__ import annotations

import math

import torch


def bias_decomposer(bias, vectors):
    """AbsDot: each part's weight is |part . bias|, normalised with the authors' 1e-12."""
    weights = torch.abs(torch.einsum("...kd,d->...k", vectors, bias))
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-12)
    return vectors + torch.matmul(weights.unsqueeze(-1), bias.unsqueeze(0))


def ln_decomposer(vectors, pre_ln_states, ln):
    mean = pre_ln_states.mean(-1, keepdim=True)
    var = (pre_ln_states - mean).pow(2).mean(-1, keepdim=True).unsqueeze(2)
    each_mean = vectors.mean(-1, keepdim=True)
    normalized = (vectors - each_mean) / (var + ln.eps) ** 0.5
    return bias_decomposer(ln.bias, torch.einsum("bskd,d->bskd", normalized, ln.weight))


def layer_norm(x, ln):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def decompx(model, input_ids, token_type_ids):
    """[n, C]: every input token's part of every class logit, and the logits [C] of this
    forward pass (float64 model, one example)."""
    cfg = model.config
    bert = model.bert
    heads = cfg.num_attention_heads
    dh = cfg.hidden_size // heads
    ids = torch.as_tensor([list(input_ids)])
    tt = torch.as_tensor([list(token_type_ids)])
    n = ids.shape[1]
    emb = bert.embeddings
    x = emb.word_embeddings(ids) + emb.token_type_embeddings(tt) + emb.position_embeddings(torch.arange(n)[None])
    hidden = layer_norm(x, emb.LayerNorm)  # [1, n, d]
    vectors = None  # the aggregated attribution vectors, [1, i, k, d]
    for layer in bert.encoder.layer:
        sa, so = layer.attention.self, layer.attention.output

        def split(t):
            return t.view(1, n, heads, dh).permute(0, 2, 1, 3)

        q, k, v = split(sa.query(hidden)), split(sa.key(hidden)), split(sa.value(hidden))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), -1)  # [1, h, n, n]
        context = (probs @ v).permute(0, 2, 1, 3).reshape(1, n, -1)
        pre_ln = so.dense(context) + hidden
        attention_output = layer_norm(pre_ln, so.LayerNorm)
        pre_act = layer.intermediate.dense(attention_output)
        inter = layer.intermediate.intermediate_act_fn(pre_act)
        pre_ln2 = layer.output.dense(inter) + attention_output
        layer_output = layer_norm(pre_ln2, layer.output.LayerNorm)

        mixing = so.dense.weight.view(cfg.hidden_size, heads, dh)
        if vectors is None:  # the first layer: the value layer (with its bias), a diagonal residual
            transformed = torch.einsum("bhsv,dhv->bhsd", v, mixing)
            weighted = torch.einsum("bhks,bhsd->bhksd", probs, transformed).sum(1)
            residual = torch.einsum("sk,bsd->bskd", torch.eye(n, dtype=hidden.dtype), hidden)
            res_weighted = weighted + residual
            accumulated_bias = so.dense.bias
        else:  # later layers: decomposed values without their bias, W_O b_V + b_O split once
            dv = torch.einsum("bijd,vd->bijv", vectors, sa.value.weight)
            dv = dv.view(1, n, n, heads, dh).permute(0, 3, 1, 2, 4)
            transformed = torch.einsum("bhsqv,dhv->bhsqd", dv, mixing)
            weighted = torch.einsum("bhks,bhsqd->bhkqd", probs, transformed).sum(1)
            res_weighted = weighted + vectors
            accumulated_bias = so.dense.weight @ sa.value.bias + so.dense.bias
        res_weighted = bias_decomposer(accumulated_bias, res_weighted)
        post_ln = ln_decomposer(res_weighted, pre_ln, so.LayerNorm)
        first = bias_decomposer(layer.intermediate.dense.bias,
                                torch.einsum("ld,bskd->bskl", layer.intermediate.dense.weight, post_ln))
        slope = inter / (pre_act + 1e-12)  # GeLU_ZO
        activated = first * slope.unsqueeze(-2)
        second = bias_decomposer(layer.output.dense.bias,
                                 torch.einsum("bskl,dl->bskd", activated, layer.output.dense.weight))
        vectors = ln_decomposer(post_ln + second, pre_ln2, layer.output.LayerNorm)
        hidden = layer_output
    pre_pooled = bert.pooler.dense(hidden[:, 0])
    pooled = torch.tanh(pre_pooled)
    post_pool = bias_decomposer(bert.pooler.dense.bias,
                                torch.einsum("ld,bsd->bsl", bert.pooler.dense.weight, vectors[:, 0]))
    post_pool = post_pool * (pooled / (pre_pooled + 1e-12)).unsqueeze(-2)  # tanh ZO
    logits = model.classifier(pooled)
    parts = bias_decomposer(model.classifier.bias, torch.einsum("ld,bkd->bkl", model.classifier.weight, post_pool))
    return parts[0], logits[0]
