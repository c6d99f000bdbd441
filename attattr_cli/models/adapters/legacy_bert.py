"""BERT-style self-attention written in the model's own code (copies of BERT's attention from
before transformers' attention interface): ``softmax(q k^T / sqrt(d) + mask) V`` with
``query``, ``key`` and ``value`` projections, the mask the model builds (additive, with the
causal part where the model is a decoder). RoFormer rotates q and k (and v where
``rotary_value``) by its sinusoidal positions first, as its own code does. Cross-attention
(``encoder_hidden_states``) is not taken over and is refused in one line."""

from __future__ import annotations

from ...errors import ModelError
from . import Adapter, register, self_attention


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

        def rotate(q, k, v):  # RoFormer's sinusoidal positions, as its own code applies them
            if module.rotary_value:
                return module.apply_rotary_position_embeddings(sinusoidal, q, k, v)
            return (*module.apply_rotary_position_embeddings(sinusoidal, q, k), v)

        return self_attention(module, attend, hidden_states, attention_mask, (module.query, module.key, module.value),
                              rotate=rotate if sinusoidal is not None else None), None
