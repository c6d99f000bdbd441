"""BLOOM and Falcon: attention computed in the model's own code, ALiBi (a per-head linear bias
of the key position) or, for Falcon without ALiBi, rotary positions. The ALiBi term is an
additive bias of the scores, passed as ``position_bias``; both are causal decoders."""

from __future__ import annotations

import sys

from . import Adapter, additive, causal_mask, merge_heads, register


@register
class Bloom(Adapter):
    model_types = ("bloom",)
    modules = ("BloomAttention",)
    causal = True

    def forward(self, module, attend, hidden_states, residual, alibi, attention_mask, layer_past=None,
                use_cache=False, output_attentions=False, **kwargs):
        b, n, _ = hidden_states.shape
        q, k, v = module._reshape(module.query_key_value(hidden_states))  # [b, h, n, d] each
        if layer_past is not None:
            k, v = layer_past.update(k, v, module.layer_idx)
        h = module.num_heads
        # scores = beta * alibi + inv_norm_factor * q k^T  (alibi: [b * h, 1, k])
        bias = (alibi.view(-1, h, 1, alibi.shape[-1]) * module.beta)
        mask = additive(attention_mask, q.dtype)
        if mask is None:
            mask = causal_mask(n, k.shape[-2], q.dtype, q.device)
        out, _ = attend(module, q, k, v, mask, scaling=module.inv_norm_factor, position_bias=bias)
        out = module.dense(merge_heads(out))
        out = sys.modules[type(module).__module__].dropout_add(out, residual, module.hidden_dropout, module.training)
        return out, None


@register
class Falcon(Adapter):
    model_types = ("falcon",)
    modules = ("FalconAttention",)
    causal = True

    def forward(self, module, attend, hidden_states, alibi, attention_mask, position_ids=None, layer_past=None,
                use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
        num_kv = module.num_heads if module.new_decoder_architecture else module.num_kv_heads
        q, k, v = module._split_heads(module.query_key_value(hidden_states))
        b, n, _, _ = q.shape
        q = q.transpose(1, 2).reshape(b, module.num_heads, n, module.head_dim)
        k = k.transpose(1, 2).reshape(b, num_kv, n, module.head_dim)
        v = v.transpose(1, 2).reshape(b, num_kv, n, module.head_dim)
        if alibi is None:
            cos, sin = position_embeddings
            q, k = sys.modules[type(module).__module__].apply_rotary_pos_emb(q, k, cos, sin)
        if layer_past is not None:
            k, v = layer_past.update(k, v, module.layer_idx)
        mask = additive(attention_mask, q.dtype)
        if mask is None:
            mask = causal_mask(n, k.shape[-2], q.dtype, q.device)
        # ALiBi: scores = (q k^T + alibi) * inv_norm_factor
        bias = None if alibi is None else alibi.view(b, module.num_heads, 1, -1) * module.inv_norm_factor
        out, _ = attend(module, q, k, v, mask, scaling=module.inv_norm_factor, position_bias=bias)
        return module.dense(merge_heads(out)), None
