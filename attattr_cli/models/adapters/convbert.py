"""ConvBERT: mixed attention. Half of each layer's heads are self-attention,
``softmax(q k^T / sqrt(d) + mask) V``, the other half a span-based dynamic convolution (a
softmax over kernel positions, computed from the layer's input, not from the attention); the
two are concatenated. attattr attributes the self-attention heads: the convolution is
computed as the model computes it and does not depend on the attention's alpha."""

from __future__ import annotations

import math

import torch

from ...errors import ModelError
from . import Adapter, additive, register, split_heads


@register
class ConvBert(Adapter):
    model_types = ("convbert",)
    modules = ("ConvBertSelfAttention",)

    def num_heads(self, model):
        return model.config.num_attention_heads // model.config.head_ratio  # the other half convolve

    def forward(self, module, attend, hidden_states, attention_mask=None, encoder_hidden_states=None, *args, **kwargs):
        if encoder_hidden_states is not None:
            raise ModelError("ConvBERT as cross-attention (encoder_hidden_states) is not supported by attattr; see"
                             " docs/models.md for the supported architectures")
        b, n = hidden_states.shape[:2]
        h, d, size = module.num_attention_heads, module.attention_head_size, module.conv_kernel_size
        mixed_q = module.query(hidden_states)
        q, k, v = (split_heads(x, d) for x in (mixed_q, module.key(hidden_states), module.value(hidden_states)))
        # the dynamic convolution, as the model's own code computes it, with the padding of a
        # group of examples (engine/grouped.py) zeroed where the convolution reads it: each
        # example's convolution sees the zeros beyond its end that it sees scored alone
        keep = _kept(attention_mask, hidden_states)
        key_conv = module.key_conv_attn_layer((hidden_states if keep is None else hidden_states * keep)
                                              .transpose(1, 2)).transpose(1, 2)
        kernel = torch.softmax(module.conv_kernel_layer(key_conv * mixed_q).reshape(-1, size, 1), dim=1)
        conv = module.conv_out_layer(hidden_states)
        conv = (conv if keep is None else conv * keep).reshape(b, -1, module.all_head_size).transpose(1, 2)
        conv = torch.nn.functional.unfold(conv.contiguous().unsqueeze(-1), kernel_size=[size, 1], dilation=1,
                                          padding=[(size - 1) // 2, 0], stride=1)
        conv = conv.transpose(1, 2).reshape(b, -1, module.all_head_size, size).reshape(-1, d, size)
        conv = torch.matmul(conv, kernel).reshape(b, -1, h, d)
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype), scaling=1.0 / math.sqrt(d))
        return torch.cat([out, conv], 2).reshape(b, n, h * d * 2), None


def _kept(attention_mask, hidden_states: torch.Tensor) -> torch.Tensor | None:
    """[batch, tokens, 1]: 1 for the tokens the first query may attend to, 0 for padding (from a
    boolean keep-mask or an additive one, [batch, 1, queries, keys] or [batch, keys]); None where
    nothing is padded."""
    if attention_mask is None or not torch.is_tensor(attention_mask):
        return None
    m = attention_mask[:, 0, 0, :] if attention_mask.dim() == 4 else attention_mask
    if m.dim() != 2 or m.shape[-1] != hidden_states.shape[1]:
        return None
    kept = m.bool() if not m.is_floating_point() else m > torch.finfo(m.dtype).min / 2
    if bool(kept.all()):
        return None
    return kept.to(hidden_states.dtype).unsqueeze(-1)
