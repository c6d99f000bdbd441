"""MPNet: BERT-like attention with a relative position bias (T5-style buckets) computed once
by the encoder and added to every layer's scores; passed on as ``position_bias``."""

from __future__ import annotations

import math

from . import Adapter, additive, register


@register
class MPNet(Adapter):
    model_types = ("mpnet",)
    modules = ("MPNetSelfAttention",)

    def forward(self, module, attend, hidden_states, attention_mask=None, position_bias=None,
                output_attentions=False, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, module.attention_head_size)
        q = module.q(hidden_states).view(shape).transpose(1, 2)
        k = module.k(hidden_states).view(shape).transpose(1, 2)
        v = module.v(hidden_states).view(shape).transpose(1, 2)
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype),
                        scaling=1.0 / math.sqrt(module.attention_head_size), position_bias=position_bias)
        return (module.o(out.reshape(out.shape[0], out.shape[1], -1)),)
