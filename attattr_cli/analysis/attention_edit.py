"""Counterfactual attention at one site: the probabilities of one layer replaced by any
function of them (value zeroing, adversarial attention, attribution of an edited map).

``attattr_edit``, one more implementation of transformers' attention interface, computes
the target site's probabilities, hands them to ``Edit.fn`` ([batch, head, query, key] -> the
same shape; the result may carry a graph) and multiplies the result with the values; every
other site, and every call outside an :func:`edited` block, goes to the engine's function
(``engine.attention.taken_over``) unchanged, so the engine is not touched.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..engine import attention
from ..ops import reference

IMPLEMENTATION = "attattr_edit"

_edit: contextvars.ContextVar = contextvars.ContextVar("attattr_edit", default=None)


@dataclass
class Edit:
    """At site (family, layer): probabilities P [batch, head, query, key] become fn(P)."""

    layer: int
    fn: Callable[[torch.Tensor], torch.Tensor]
    family: str = "self"


def edit_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    plan = _edit.get()
    site = attention.plan_site_of(module)
    if plan is None or site != (plan.family, plan.layer):
        return attention.attattr_attention(module, query, key, value, attention_mask, scaling=scaling,
                                           dropout=dropout, **kwargs)
    heads = query.shape[1]
    key = attention.repeat_kv(key, heads)
    value = attention.repeat_kv(value, heads)
    mask = attention.causal_fill(module, query, key, attention_mask)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min)
    probs = reference.attention_probs(query, key, mask, scaling, kwargs.get("softcap"))
    probs = plan.fn(probs).to(value.dtype)
    if probs.shape[0] != value.shape[0]:
        probs = probs.expand(value.shape[0], *probs.shape[1:])
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


AttentionInterface.register(IMPLEMENTATION, edit_attention)
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


@contextlib.contextmanager
def edited(model, plan: Edit):
    """Run ``model`` with ``plan`` at its site (inside the engine's takeover)."""
    with attention.taken_over(model) as layers:
        old = attention.set_impl(model, IMPLEMENTATION)
        token = _edit.set(plan)
        try:
            yield layers
        finally:
            _edit.reset(token)
            for cfg, impl in old.values():
                cfg._attn_implementation = impl
