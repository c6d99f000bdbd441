"""DeBERTa and DeBERTa-v2/v3: disentangled attention.

The scores are ``q k^T / s + c2p + p2c`` (content-to-position and position-to-content terms of
the relative positions, ``s = sqrt(d * (1 + number of terms))``). With the layer's queries and
keys fixed (they come from the layers below), both terms are a fixed additive bias of A's
scores, computed here by the model's own code and passed as ``position_bias``."""

from __future__ import annotations

import math
import sys

from ...errors import ModelError
from . import Adapter, additive, merge_heads, refuse, register, rows_equal


def _one_row(hidden, query_states):
    """Where every row is the same (a target layer), compute on one and expand at the end."""
    if rows_equal(hidden) and (query_states is None or rows_equal(query_states)):
        return hidden[:1], None if query_states is None else query_states[:1], hidden.shape[0]
    return hidden, query_states, None


_SCALES: dict = {}  # (helper, head width, scale factor) -> the model's divisor


def _scale(module, query, scale_factor) -> float:
    """The model's own divisor (its module's ``scaled_size_sqrt``: float32), as a float. It
    depends on the head width and the factor only, so it is asked of the model once per pair
    (a host copy, in the clean forward) and not inside every pass (issue 53)."""
    helper = getattr(sys.modules[type(module).__module__], "scaled_size_sqrt", None)
    if helper is None:
        return math.sqrt(query.shape[-1] * scale_factor)
    key = (helper, query.shape[-1], scale_factor)
    if key not in _SCALES:
        _SCALES[key] = float(helper(query, scale_factor))
    return _SCALES[key]


def _heads(x, b, h):
    """[b * h, n, d] -> [b, h, n, d]"""
    return x.view(b, h, x.shape[-2], x.shape[-1])


class _Disentangled(Adapter):
    """DeBERTa's attention; a subclass gives q, k, v, the disentangled bias and the scaling (:meth:`scores`)."""

    modules = ("DisentangledSelfAttention",)

    def forward(self, module, attend, hidden_states, attention_mask, output_attentions=False,
                query_states=None, relative_pos=None, rel_embeddings=None):
        batch = hidden_states.shape[0]
        hidden_states, query_states, expand = _one_row(hidden_states, query_states)
        q, k, v, bias, scaling = self.scores(module, hidden_states, query_states, relative_pos, rel_embeddings)
        if expand is not None:
            q, k, v = (t.expand(expand, *t.shape[1:]) for t in (q, k, v))
            bias = None if bias is None else bias.expand(expand, *bias.shape[1:])
        mask = additive(attention_mask, q.dtype)
        if mask is not None and mask.shape[0] == 1 and batch > 1:
            mask = mask.expand(batch, *mask.shape[1:])
        out, _ = attend(module, q, k, v, mask, scaling=scaling, position_bias=bias)
        return merge_heads(out), None


@register
class DebertaV2(_Disentangled):
    model_types = ("deberta-v2",)

    def scores(self, module, hidden_states, query_states, relative_pos, rel_embeddings):
        h = module.num_attention_heads
        b = hidden_states.shape[0]
        query = module.transpose_for_scores(module.query_proj(
            hidden_states if query_states is None else query_states), h)
        key = module.transpose_for_scores(module.key_proj(hidden_states), h)
        value = module.transpose_for_scores(module.value_proj(hidden_states), h)
        scale_factor = 1 + sum(t in module.pos_att_type for t in ("c2p", "p2c"))
        bias = None
        if module.relative_attention:
            bias = _heads(module.disentangled_attention_bias(
                query, key, relative_pos, module.pos_dropout(rel_embeddings), scale_factor), b, h)
        q, k, v = (_heads(t, b, h) for t in (query, key, value))
        return q, k, v, bias, 1.0 / _scale(module, q, scale_factor)


@register
class Deberta(_Disentangled):
    model_types = ("deberta",)

    def scores(self, module, hidden_states, query_states, relative_pos, rel_embeddings):
        if query_states is not None:
            raise ModelError("DeBERTa with separate query states is not supported by attattr")
        qp = module.in_proj(hidden_states)
        query, key, value = module.transpose_for_scores(qp).chunk(3, dim=-1)
        query = query + module.transpose_for_scores(module.q_bias[None, None, :])
        value = value + module.transpose_for_scores(module.v_bias[None, None, :])
        scale_factor = 1 + len(module.pos_att_type)
        query = query / _scale(module, query, scale_factor)
        bias = None
        if module.relative_attention and rel_embeddings is not None and relative_pos is not None:
            bias = module.disentangled_att_bias(query, key, relative_pos, module.pos_dropout(rel_embeddings),
                                                scale_factor)
        return query, key, value, bias, 1.0


refuse("deberta", "DeBERTa with talking_head mixes the heads' attention probabilities after the softmax, so no head has"
                  " its own A V; attattr supports DeBERTa without talking_head", flag="talking_head")
