"""BigBird (and BigBird-Pegasus' encoder): full attention (``attention_type="original_full"``)
in the model's own code.

For inputs up to ``(5 + 2 * num_random_blocks) * block_size`` tokens a block-sparse BigBird
itself switches to full attention (its sparse pattern would cover every key), so attattr runs
it with full attention while it is taken over and puts the setting back afterwards. Longer
inputs, where the block-sparse pattern (random blocks) is really used, are refused."""

from __future__ import annotations

import torch

from ...errors import ModelError
from . import Adapter, register, self_attention


@register
class BigBird(Adapter):
    model_types = ("big_bird", "bigbird_pegasus")
    modules = ("BigBirdSelfAttention", "BigBirdPegasusSelfAttention")

    def install_model(self, model):
        base = getattr(model, "bert", None)  # BigBird; BigBird-Pegasus: its encoder
        base = base if base is not None else getattr(getattr(model, "model", model), "encoder", model)
        if getattr(base, "attention_type", "original_full") != "block_sparse":
            return []
        cfg = model.config
        # the sparse attention modules and every attention_type flag, put back as they were
        types = [(m, m.attention_type) for m in base.modules() if isinstance(getattr(m, "attention_type", None), str)]
        sparse = [(m, m.self) for m in base.modules() if isinstance(getattr(m, "self", None), torch.nn.Module)]
        base.set_attention_type("original_full")
        for module in base.modules():
            if type(module).__name__ in self.modules:
                module._attattr_limit = (5 + 2 * cfg.num_random_blocks) * cfg.block_size

        def undo():
            for m, child in sparse:
                m.self = child
            for m, kind in types:
                m.attention_type = kind
        return [undo]

    def forward(self, module, attend, hidden_states, attention_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, cache=None, **kwargs):
        n = hidden_states.shape[1]
        limit = getattr(module, "_attattr_limit", None)
        if limit is not None and n > limit:
            raise ModelError(f"this BigBird model uses block-sparse attention (random blocks) for inputs over {limit}"
                             f" tokens, and this one has {n}: attattr supports BigBird's full attention, up to"
                             f" {limit} tokens (pass --truncate or shorter inputs)")
        if encoder_hidden_states is not None:
            raise ModelError("BigBird cross-attention is not supported by attattr")
        return self_attention(module, attend, hidden_states, attention_mask,
                              (module.query, module.key, module.value)), None
