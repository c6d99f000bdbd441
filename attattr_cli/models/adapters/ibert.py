"""I-BERT outside its quantized mode: BERT's attention through its own quantization-aware
modules, which pass values through unchanged when ``quant_mode`` is off. With ``quant_mode``
on, its softmax is an integer polynomial approximation: refused in one line."""

from __future__ import annotations

import math

from ...errors import ModelError
from . import Adapter, additive, register


@register
class IBert(Adapter):
    model_types = ("ibert",)
    modules = ("IBertSelfAttention",)

    def check(self, model) -> None:
        if getattr(model.config, "quant_mode", False):
            raise ModelError("I-BERT in quant_mode computes an integer approximation of the softmax, not softmax"
                             " attention; load it with quant_mode=False; see docs/models.md for the supported"
                             " architectures")

    def forward(self, module, attend, hidden_states, hidden_states_scaling_factor=None, attention_mask=None,
                output_attentions=False):
        shape = (*hidden_states.shape[:-1], -1, module.attention_head_size)
        qkv = []
        for proj, act in ((module.query, module.query_activation), (module.key, module.key_activation),
                          (module.value, module.value_activation)):
            x, sf = proj(hidden_states, hidden_states_scaling_factor)
            qkv.append(act(x, sf)[0].view(shape).transpose(1, 2))
        q, k, v = qkv
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype),
                        scaling=1.0 / math.sqrt(module.attention_head_size))
        context, scaling = module.output_activation(out.reshape(out.shape[0], out.shape[1], -1), None)
        return (context,), (scaling,)
