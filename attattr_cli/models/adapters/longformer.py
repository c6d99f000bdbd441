"""Longformer: sliding-window local attention plus global attention, as the model computes it
(docs/models.md, the adapters' table, says which key each query attends to).

The model computes it in a banded layout over an input padded to a multiple of the window; the
adapter computes the same attention as one n x n matrix with the band as a mask (no padding: it is
turned off while taken over). Rows of both kinds are one attention: queries ``[q, 0]`` (local) or
``[0, q_global]`` (global), keys ``[k, k_global]``, values ``[v, v_global]``, each row's output
taking the half of its kind, so that ``A * (G V^T)`` is each row's own attribution."""

from __future__ import annotations

import math

import torch

from . import Adapter, blocked_mask, register


@register
class Longformer(Adapter):
    model_types = ("longformer",)
    modules = ("LongformerSelfAttention",)

    def install_model(self, model):
        base = getattr(model, "longformer", model)

        def no_padding(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, pad_token_id):
            return 0, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

        base._pad_to_window_size = no_padding
        return [lambda: base.__dict__.pop("_pad_to_window_size", None)]

    def forward(self, module, attend, hidden_states, attention_mask=None, is_index_masked=None,
                is_index_global_attn=None, is_global_attn=None, output_attentions=False):
        b, n, _ = hidden_states.shape
        h, d = module.num_heads, module.head_dim

        def heads(x):
            return x.view(b, n, h, d).transpose(1, 2)

        root = 1.0 / math.sqrt(d)
        q, k, v = heads(module.query(hidden_states)) * root, heads(module.key(hidden_states)), \
            heads(module.value(hidden_states))
        glob = attention_mask > 0  # [b, n]
        masked = attention_mask < 0
        qg, kg, vg = heads(module.query_global(hidden_states)) * root, heads(module.key_global(hidden_states)), \
            heads(module.value_global(hidden_states))
        g = glob[:, None, :, None].to(q.dtype)
        query = torch.cat([q * (1 - g), qg * g], -1)
        key = torch.cat([k, kg], -1)
        value = torch.cat([v, vg], -1)
        pos = torch.arange(n, device=q.device)
        band = (pos[:, None] - pos[None, :]).abs() <= module.one_sided_attn_window_size  # [n, n]
        local = band[None] & ~glob[:, None, :] & ~masked[:, None, :] | glob[:, None, :]  # [b, n, n]
        allowed = torch.where(glob[:, :, None], ~masked[:, None, :], local)
        mask = blocked_mask(~allowed, q.dtype)[:, None]
        out, _ = attend(module, query, key, value, mask, scaling=1.0)  # [b, n, h, 2d]
        out = torch.where(glob[:, :, None, None], out[..., d:], out[..., :d])
        return (out.reshape(b, n, h * d),)
