"""ALBERT: one layer group shared by every layer.

A site is a call of the shared module in order, not a module: while a model is taken over,
the encoder's loop calls :class:`SharedCalls`, one proxy per layer (proxy i runs the shared
group as layer i), so that replaying, hooks and the target's attention see L layers. The
proxies live beside the model (not registered in it: its modules and weights are unchanged)."""

from __future__ import annotations

import contextvars

import torch

from . import Adapter, register

# the layer index of the shared call running now (None outside a proxy)
CALL: contextvars.ContextVar = contextvars.ContextVar("attattr_shared_call", default=None)


class SharedCall(torch.nn.Module):
    """Layer ``index`` of a stack whose layers share one module (``shared``)."""

    def __init__(self, shared: torch.nn.Module, index: int):
        super().__init__()
        self.shared = shared
        self.index = index

    def forward(self, *args, **kwargs):
        token = CALL.set(self.index)
        try:
            return self.shared(*args, **kwargs)
        finally:
            CALL.reset(token)


class SharedCalls(torch.nn.ModuleList):
    """The L proxies of a shared stack (a ModuleList, so that it is found as the layer list)."""

    shared_calls = True


@register
class Albert(Adapter):
    model_types = ("albert",)
    modules = ()

    @staticmethod
    def _encoder(model):
        base = getattr(model, "albert", model)
        return base.encoder

    def layer_list(self, model):
        enc = self._encoder(model)
        calls = enc.__dict__.get("_attattr_calls")
        if calls is None:
            cfg = model.config
            groups = enc.albert_layer_groups
            calls = SharedCalls([SharedCall(groups[int(i / (cfg.num_hidden_layers / cfg.num_hidden_groups))], i)
                                 for i in range(cfg.num_hidden_layers)])
            object.__setattr__(enc, "_attattr_calls", calls)  # not a registered submodule
        prefix = "albert.encoder" if hasattr(model, "albert") else "encoder"
        return f"{prefix}.calls", calls

    def install_model(self, model):
        enc = self._encoder(model)
        _, calls = self.layer_list(model)

        def forward(hidden_states, attention_mask=None, **kwargs):
            from transformers.modeling_outputs import BaseModelOutput

            hidden_states = enc.embedding_hidden_mapping_in(hidden_states)
            for call in calls:
                hidden_states = call(hidden_states, attention_mask, **kwargs)
            return BaseModelOutput(last_hidden_state=hidden_states)

        enc.forward = forward
        return [lambda: enc.__dict__.pop("forward", None)]
