"""LUKE on words alone: BERT's attention over the word sequence (``softmax(q k^T / sqrt(d) +
mask) V``). Entity inputs (entity-aware attention over words and entities) are refused in one
line: their maps are not token by token."""

from __future__ import annotations

from ...errors import ModelError
from . import Adapter, register, self_attention


@register
class Luke(Adapter):
    model_types = ("luke",)
    modules = ("LukeSelfAttention",)

    def forward(self, module, attend, word_hidden_states, entity_hidden_states=None, attention_mask=None,
                output_attentions=False):
        if entity_hidden_states is not None:
            raise ModelError("LUKE with entity inputs (attention over words and entities) is not supported by attattr;"
                             " score the words alone; see docs/models.md for the supported architectures")
        return self_attention(module, attend, word_hidden_states, attention_mask,
                              (module.query, module.key, module.value)), None
