"""LUKE on words alone: BERT's attention over the word sequence (``softmax(q k^T / sqrt(d) +
mask) V``). Entity inputs (entity-aware attention over words and entities) are refused in one
line: their maps are not token by token."""

from __future__ import annotations

import math

from ...errors import ModelError
from . import Adapter, additive, register


@register
class Luke(Adapter):
    model_types = ("luke",)
    modules = ("LukeSelfAttention",)

    def forward(self, module, attend, word_hidden_states, entity_hidden_states=None, attention_mask=None,
                output_attentions=False):
        if entity_hidden_states is not None:
            raise ModelError("LUKE with entity inputs (attention over words and entities) is not supported by attattr;"
                             " score the words alone; see docs/models.md for the supported architectures")
        shape = (*word_hidden_states.shape[:-1], -1, module.attention_head_size)
        q, k, v = (p(word_hidden_states).view(shape).transpose(1, 2) for p in (module.query, module.key, module.value))
        out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype),
                        scaling=1.0 / math.sqrt(module.attention_head_size))
        return out.reshape(out.shape[0], out.shape[1], -1), None
