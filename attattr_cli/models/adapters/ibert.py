"""I-BERT outside its quantized mode: BERT's attention through its own quantization-aware
modules, which pass values through unchanged when ``quant_mode`` is off. With ``quant_mode``
on, its softmax is an integer polynomial approximation: refused in one line."""

from __future__ import annotations

from . import Adapter, refuse, register, self_attention


@register
class IBert(Adapter):
    model_types = ("ibert",)
    modules = ("IBertSelfAttention",)

    def forward(self, module, attend, hidden_states, scaling_factor=None, attention_mask=None, output_attentions=False):
        projections = [lambda x, p=proj, a=act: a(*p(x, scaling_factor))[0]
                       for proj, act in ((module.query, module.query_activation), (module.key, module.key_activation),
                                         (module.value, module.value_activation))]
        out = self_attention(module, attend, hidden_states, attention_mask, projections)
        context, scaling = module.output_activation(out, None)
        return (context,), (scaling,)


refuse("ibert", "I-BERT in quant_mode computes an integer approximation of the softmax, not softmax attention; load it"
                " with quant_mode=False; see docs/models.md for the supported architectures", flag="quant_mode")
