"""MVP: BART's attention written in the model's own code (encoder, decoder and cross-attention,
``softmax((q / sqrt(d)) k^T + mask)``, the mask the model builds). Its prompts (``use_prompt``:
learned keys and values put before the tokens' in every layer) are refused in one line."""

from __future__ import annotations

from . import Adapter, additive, refuse, register, split_heads


@register
class Mvp(Adapter):
    model_types = ("mvp",)
    modules = ("MvpAttention",)

    def forward(self, module, attend, hidden_states, key_value_states=None, cache=None, attention_mask=None,
                attn_prompt=None, output_attentions=False, **kwargs):
        b, n, _ = hidden_states.shape
        source = hidden_states if key_value_states is None else key_value_states
        q = split_heads(module.q_proj(hidden_states) * module.scaling, module.head_dim)
        k, v = (split_heads(p(source), module.head_dim) for p in (module.k_proj, module.v_proj))
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype), scaling=1.0)
        return module.out_proj(out.reshape(b, n, -1)), None


refuse("mvp", "MVP with prompts (use_prompt: learned keys and values before the tokens') is not supported by attattr;"
              " see docs/models.md for the supported architectures", flag="use_prompt")
