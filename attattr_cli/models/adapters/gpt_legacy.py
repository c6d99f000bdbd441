"""Decoders whose causal self-attention is written in their own code, each taken over as it
computes it:

* OpenAI GPT: ``softmax(q k^T / sqrt(d) + causal)`` from one fused ``c_attn`` projection (its
  causal mask adds -1e4, which is exp-underflow zero; attattr masks with the dtype's minimum);
* GPT-Neo: unscaled scores ``q k^T`` (no 1/sqrt(d)), causal, and on its local layers only the
  last ``window_size`` keys (the model's own mask buffer, read as it is). GPT-Neo's eager code
  computes the scores in float32; attattr in the model's dtype.
"""

from __future__ import annotations

import math
import sys

import torch

from . import Adapter, additive, blocked_mask, causal_mask, merge_heads, register, split_heads


def _with(mask: torch.Tensor, attention_mask, dtype) -> torch.Tensor:
    """The causal (or banded) additive mask plus the model's padding mask, never below the dtype's minimum."""
    extra = additive(attention_mask, dtype)
    return mask if extra is None else (mask + extra.to(dtype)).clamp(min=torch.finfo(dtype).min)


@register
class OpenAIGPT(Adapter):
    model_types = ("openai-gpt",)
    modules = ("Attention",)
    causal = True

    def forward(self, module, attend, x, attention_mask=None, output_attentions=False, **kwargs):
        q, k, v = module.c_attn(x).split(module.split_size, dim=2)
        shape = (*q.shape[:-1], module.n_head, -1)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        n = q.shape[-2]
        mask = _with(causal_mask(n, n, q.dtype, q.device), attention_mask, q.dtype)
        out, _ = attend(module, q, k, v, mask, scaling=1.0 / math.sqrt(v.shape[-1]) if module.scale else 1.0)
        return [module.resid_dropout(module.c_proj(merge_heads(out)))]


@register
class GPTNeo(Adapter):
    model_types = ("gpt_neo",)
    modules = ("GPTNeoSelfAttention",)
    causal = True

    def forward(self, module, attend, hidden_states, attention_mask=None, *args, **kwargs):
        q, k, v = (split_heads(p(hidden_states), module.head_dim)
                   for p in (module.q_proj, module.k_proj, module.v_proj))
        n = q.shape[-2]
        allowed = module.bias[:, :, :n, :n]  # causal, and banded on local layers
        out, _ = attend(module, q, k, v, _with(blocked_mask(~allowed, q.dtype), attention_mask, q.dtype), scaling=1.0)
        out = module.resid_dropout(module.out_proj(merge_heads(out)))
        return out, None


@register
class XGLM(Adapter):
    """XGLM: ``softmax((q / sqrt(d)) k^T + mask)`` in its own code, with the causal mask the model
    builds. (Its eager code clamps the scores with a float32 constant and cannot run in float64;
    taken over, it runs in any dtype.)"""

    model_types = ("xglm",)
    modules = ("XGLMAttention",)
    causal = True

    def forward(self, module, attend, hidden_states, key_value_states=None, cache=None, attention_mask=None,
                **kwargs):
        b, n, _ = hidden_states.shape
        q = split_heads(module.q_proj(hidden_states) * module.scaling, module.head_dim)
        k, v = (split_heads(p(hidden_states), module.head_dim) for p in (module.k_proj, module.v_proj))
        mask = additive(attention_mask, q.dtype)
        mask = causal_mask(n, n, q.dtype, q.device) if mask is None else mask
        out, _ = attend(module, q, k, v, mask, scaling=1.0)
        return module.out_proj(out.reshape(b, n, -1)), None


@register
class GPTNeoXJapanese(Adapter):
    """GPT-NeoX-Japanese: one fused projection per head ``[q, k, v]``, rotary positions on the
    first ``rotary_ndims`` dimensions of q and k (the model's own function), scores over
    ``sqrt(d)``, the causal mask the model builds; returns the output bias apart, as the model."""

    model_types = ("gpt_neox_japanese",)
    modules = ("GPTNeoXJapaneseAttention",)
    causal = True

    def forward(self, module, attend, hidden_states, attention_mask=None, position_ids=None, layer_past=None,
                use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
        rotate = sys.modules[type(module).__module__].apply_rotary_pos_emb
        b, n, _ = hidden_states.shape
        h, d, r = module.num_attention_heads, module.head_size, module.rotary_ndims
        qkv = module.query_key_value(hidden_states).view(b, n, h, 3 * d).permute(0, 2, 1, 3)
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        cos, sin = position_embeddings
        q_rot, k_rot = rotate(q[..., :r], k[..., :r], cos, sin)
        q, k = torch.cat((q_rot, q[..., r:]), -1), torch.cat((k_rot, k[..., r:]), -1)
        mask = additive(attention_mask, q.dtype)
        mask = causal_mask(n, n, q.dtype, q.device) if mask is None else mask
        out, _ = attend(module, q, k, v, mask, scaling=1.0 / module.norm_factor)
        return module.dense(out.reshape(b, n, -1)), None, module.dense_bias
