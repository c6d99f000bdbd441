"""MPNet: BERT-like attention with a relative position bias (T5-style buckets) computed once
by the encoder and added to every layer's scores; passed on as ``position_bias``."""

from __future__ import annotations

from . import Adapter, register, self_attention


@register
class MPNet(Adapter):
    model_types = ("mpnet",)
    modules = ("MPNetSelfAttention",)

    def forward(self, module, attend, hidden_states, attention_mask=None, position_bias=None,
                output_attentions=False, **kwargs):
        return (module.o(self_attention(module, attend, hidden_states, attention_mask, (module.q, module.k, module.v),
                                        position_bias)),)
