"""MPT: attention in the model's own code, ``softmax(scale * q k^T + alibi + mask)``, with one
fused ``Wqkv`` projection (clamped where ``clip_qkv``), ALiBi as the model's ``position_bias``
(a per-head slope times the key position, passed on as ``position_bias``) and a boolean mask
that is True where a key is blocked."""

from __future__ import annotations

from . import Adapter, blocked_mask, causal_mask, register


@register
class MPT(Adapter):
    model_types = ("mpt",)
    modules = ("MptAttention",)
    causal = True

    def forward(self, module, attend, hidden_states, position_bias=None, cache=None, attention_mask=None, **kwargs):
        b, n = hidden_states.shape[:2]
        qkv = module.Wqkv(hidden_states)
        if module.clip_qkv:
            qkv = qkv.clamp(min=-module.clip_qkv, max=module.clip_qkv)
        q, k, v = (t.reshape(b, n, module.n_heads, module.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=2))
        if attention_mask is None:
            mask = causal_mask(n, n, q.dtype, q.device)
        else:
            mask = blocked_mask(attention_mask.bool(), q.dtype)
        bias = None
        if position_bias is not None:  # [heads, 1 or n, max] cut to the last n query and key positions
            bias = position_bias[:, max(0, position_bias.size(1) - n):, max(0, position_bias.size(2) - n):][None]
        out, _ = attend(module, q, k, v, mask, scaling=module.softmax_scale, position_bias=bias)
        return module.out_proj(out.reshape(b, n, -1)), None
