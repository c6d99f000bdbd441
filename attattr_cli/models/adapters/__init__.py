"""Attention that does not go through transformers' attention interface, taken over where each
architecture computes it (docs/models.md, "Attention outside the interface: adapters").

While a model is taken over, an :class:`Adapter` replaces the attention module's ``forward``: it
computes what the model computes (queries, keys, values, the additive score bias of relative
positions, the mask) and hands them to the interface path's attention function
(:mod:`attattr_cli.engine.attention`), the bias as ``position_bias``. The contract is the interface
path's: the attention is ``softmax(scale * q k^T + bias + mask)``, its output ``A V``.

An architecture is one registered entry, in one file of this package (imported below):
``@register`` on an Adapter subclass, or :func:`refuse` for a model type (or a configuration of
one) attattr cannot attribute honestly, with the reason :func:`check` gives at ``load_model``.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from typing import Callable

import torch

from ...errors import ModelError

ADAPTERS: dict[str, "Adapter"] = {}  # model_type -> adapter
REFUSED: dict[str, str] = {}  # model_type -> why attattr cannot attribute it
REFUSED_WITH: dict[str, tuple[str, str]] = {}  # model_type -> (config flag, why it cannot be attributed with it set)


class Adapter:
    """Takes over the attention modules of one architecture.

    ``model_types``: the config model types it serves; ``modules``: class names of the attention
    modules whose ``forward`` it replaces. :meth:`forward` has the module's signature after
    ``(module, attend)``, where ``attend`` is attattr's attention function
    ``attend(module, q, k, v, mask, scaling=..., position_bias=...)`` -> (output [b, n, h, d], _).
    """

    model_types: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    causal: bool | None = None  # the architecture applies a causal mask itself (None: ask the model)

    def layer_list(self, model: torch.nn.Module):
        """(dotted path, ModuleList) of the layers where they are not one ModuleList (shared
        layers), else None."""
        return None

    def install_model(self, model: torch.nn.Module) -> list[Callable[[], None]]:
        """Model-level changes while taken over; returns what undoes them."""
        return []

    def num_heads(self, model: torch.nn.Module) -> int | None:
        """The attention heads of each layer where the config's count is not it (None: the config's)."""
        return None

    def forward(self, module, attend: Callable, *args, **kwargs):
        raise NotImplementedError


def register(cls):
    adapter = cls()
    for model_type in cls.model_types:
        ADAPTERS[model_type] = adapter
    return cls


def refuse(model_type: str, why: str, flag: str | None = None) -> None:
    """Refuse ``model_type`` at load_model, or with ``flag`` only its configurations with that flag set."""
    if flag is None:
        REFUSED[model_type] = why
    else:
        REFUSED_WITH[model_type] = (flag, why)


def adapter_for(model: torch.nn.Module) -> Adapter | None:
    return ADAPTERS.get(getattr(model.config, "model_type", ""))


def check(model: torch.nn.Module) -> None:
    """Refuse, in one ModelError line, a model attattr cannot attribute honestly."""
    model_type = getattr(model.config, "model_type", "")
    if model_type in REFUSED:
        raise ModelError(f"model type '{model_type}' is not supported: {REFUSED[model_type]}; see docs/models.md"
                         " for the supported architectures")
    flag, why = REFUSED_WITH.get(model_type, ("", ""))
    if flag and getattr(model.config, flag, False):
        raise ModelError(why)


def install(model: torch.nn.Module, attend: Callable) -> list[Callable[[], None]]:
    """Take over the model's attention modules the adapter serves (their ``forward`` replaced)
    and make the adapter's model-level changes; returns what undoes each, to call in order."""
    adapter = adapter_for(model)
    if adapter is None:
        return []
    undo = list(adapter.install_model(model))
    for module in model.modules():
        if type(module).__name__ in adapter.modules:
            module.forward = (lambda *a, _m=module, **k: adapter.forward(_m, attend, *a, **k))
            undo.append(lambda _m=module: _m.__dict__.pop("forward", None))
    return undo


def blocked_mask(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive float mask of ``blocked``'s shape: 0 where it is False, dtype's min where True."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill(blocked, torch.finfo(dtype).min)


def additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean or 0/1 keep-mask as an additive float mask (0 kept, dtype's min blocked)."""
    if mask is None or mask.is_floating_point():
        return mask
    return blocked_mask(~mask.bool(), dtype)


def causal_mask(n_q: int, n_k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The additive causal mask [1, 1, n_q, n_k] (key j allowed for query i when j <= i + n_k - n_q)."""
    return blocked_mask(~torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q), dtype)[None, None]


def split_heads(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """[b, n, h * d] -> [b, h, n, d]"""
    return x.view(*x.shape[:-1], -1, head_size).transpose(1, 2)


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """[b, n, h, d] -> [b, n, h * d]"""
    return out.reshape(out.shape[0], out.shape[1], -1)


def self_attention(module, attend: Callable, hidden_states, attention_mask, projections, position_bias=None,
                   rotate: Callable | None = None) -> torch.Tensor:
    """BERT's attention ``softmax(q k^T / sqrt(d) + bias + mask) V`` as [b, n, h * d]: q, k and v
    are the three ``projections`` of ``hidden_states`` in heads of the module's
    ``attention_head_size`` d (then ``rotate(q, k, v)`` -> (q, k, v), where given), the model's
    mask made additive."""
    d = module.attention_head_size
    q, k, v = (split_heads(p(hidden_states), d) for p in projections)
    if rotate is not None:
        q, k, v = rotate(q, k, v)
    out, _ = attend(module, q, k, v, additive(attention_mask, q.dtype), scaling=1.0 / math.sqrt(d),
                    position_bias=position_bias)
    return merge_heads(out)


def rows_equal(x: torch.Tensor) -> bool:
    """Whether every batch row of ``x`` is the same view (a target layer's replayed input):
    the adapter then computes one row and expands it, as the projections do."""
    return torch.is_tensor(x) and x.dim() > 1 and x.shape[0] > 1 and x.stride(0) == 0


for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
