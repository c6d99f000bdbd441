"""BERT-style self-attention written in the model's own code (copies of BERT's attention from
before transformers' attention interface): ``softmax(q k^T / sqrt(d) + mask) V`` with
``query``, ``key`` and ``value`` projections, the mask the model builds (additive, with the
causal part where the model is a decoder). RoFormer rotates q and k (and v where
``rotary_value``) by its sinusoidal positions first, as its own code does. Cross-attention
(``encoder_hidden_states``) is not taken over and is refused in one line."""

from __future__ import annotations

import math

from ...errors import ModelError
from . import Adapter, additive, register


@register
class LegacyBert(Adapter):
    model_types = ("megatron-bert", "rembert", "roformer")
    modules = ("MegatronBertSelfAttention", "RemBertSelfAttention", "RoFormerSelfAttention")

    def forward(self, module, attend, hidden_states, attention_mask=None, *args, **kwargs):
        rotary = type(module).__name__ == "RoFormerSelfAttention"
        sinusoidal = (args[0] if args else kwargs.get("sinusoidal_pos")) if rotary else None
        rest = args[1:] if rotary else args
        cross = rest[0] if rest else kwargs.get("encoder_hidden_states")
        if cross is not None:
            raise ModelError(f"{type(module).__name__} as cross-attention (encoder_hidden_states) is not supported by"
                             " attattr; see docs/models.md for the supported architectures")
        shape = (*hidden_states.shape[:-1], -1, module.attention_head_size)
        q = module.query(hidden_states).view(shape).transpose(1, 2)
        k = module.key(hidden_states).view(shape).transpose(1, 2)
        v = module.value(hidden_states).view(shape).transpose(1, 2)
        if sinusoidal is not None:
            if module.rotary_value:
                q, k, v = module.apply_rotary_position_embeddings(sinusoidal, q, k, v)
            else:
                q, k = module.apply_rotary_position_embeddings(sinusoidal, q, k)
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype),
                        scaling=1.0 / math.sqrt(module.attention_head_size))
        return out.reshape(out.shape[0], out.shape[1], -1), None
