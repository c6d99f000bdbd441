"""MVP: BART's attention written in the model's own code (encoder, decoder and cross-attention,
``softmax((q / sqrt(d)) k^T + mask)``, the mask the model builds). Its prompts (``use_prompt``:
learned keys and values put before the tokens' in every layer) are refused in one line."""

from __future__ import annotations

from ...errors import ModelError
from . import Adapter, additive, register


@register
class Mvp(Adapter):
    model_types = ("mvp",)
    modules = ("MvpAttention",)

    def check(self, model) -> None:
        if getattr(model.config, "use_prompt", False):
            raise ModelError("MVP with prompts (use_prompt: learned keys and values before the tokens') is not"
                             " supported by attattr; see docs/models.md for the supported architectures")

    def forward(self, module, attend, hidden_states, key_value_states=None, cache=None, attention_mask=None,
                attn_prompt=None, output_attentions=False, **kwargs):
        b, n, _ = hidden_states.shape
        source = hidden_states if key_value_states is None else key_value_states
        q = (module.q_proj(hidden_states) * module.scaling).view(b, n, module.num_heads, module.head_dim).transpose(1, 2)
        shape = (b, source.shape[1], module.num_heads, module.head_dim)
        k, v = (p(source).view(shape).transpose(1, 2) for p in (module.k_proj, module.v_proj))
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype), scaling=1.0)
        return module.out_proj(out.reshape(b, n, -1)), None
