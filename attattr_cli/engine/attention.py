"""attattr's attention function, registered with transformers' attention interface.

While a model runs inside :func:`taken_over`, every self-attention call of every layer
comes here. What it does depends on the active plan:

* ``Record``: the clean forward at batch 1. Eager attention; the probabilities
  ``[batch=1, head, query_pos, key_pos]`` of every layer are kept.
* ``Attribute``: the integral for one target layer. The model's input batch holds one
  copy of the example per integration step; layers below the target do not run (their
  output is replayed from the clean forward, expanded to the batch), the target layer
  computes A and A·V once from the first copy and returns ``alpha_k * (A V)`` for step k
  as a leaf tensor whose gradient is dF/dO_k, and the layers above run as usual.
* ``Permute``: counterfactual attention for the permutation test (Jain & Wallace 2019):
  the target layer's probabilities are gathered along the key axis with a given index,
  one permutation per batch row.

``Record(keep_graph=True)`` also keeps the probabilities with their autograd graph, for
gradients with respect to the attention of every layer (token importance).

Outside a plan (or for layers a plan does not touch) the function is plain attention.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..errors import ModelError
from ..models.arch import find_layers
from ..ops import reference

IMPLEMENTATION = "attattr"

_plan: contextvars.ContextVar[Any] = contextvars.ContextVar("attattr_plan", default=None)


@dataclass
class Record:
    """Clean forward: keep each layer's attention probabilities.

    With ``grad_layers``, the output of those layers' attention gets a zero leaf added
    (``O + z``), so that one backward of the clean forward gives dF/dO at alpha = 1 for
    every layer at once (the alpha = 1 step is the same point for every target layer).
    """

    probs: dict[int, torch.Tensor] = field(default_factory=dict)
    grad_layers: frozenset = frozenset()
    leaves: dict[int, torch.Tensor] = field(default_factory=dict)
    keep_graph: bool = False  # also keep the probabilities with their graph in ``live``
    live: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class Permute:
    """Counterfactual attention (Jain & Wallace 2019): in layer ``layer`` every batch row
    b uses the attention probabilities of the clean input with each (head, query) row's
    weights moved to other keys, ``A'[b, h, i, j] = A[b, h, i, index[b, h, i, j]]``.

    ``index``: [batch, head, query_pos, key_pos] long, a permutation of the key positions
    in every row. Every other layer computes its attention normally.
    """

    layer: int
    index: torch.Tensor


@dataclass
class Attribute:
    """One chunk of integration steps for one target layer."""

    layer: int
    alphas: torch.Tensor  # [chunk]
    backend: Any
    leaf: torch.Tensor | None = None  # [chunk, head, query_pos, d_head], requires grad
    called: bool = False  # the target layer's attention has run in this pass
    saved: dict[str, Any] = field(default_factory=dict)  # q, k, v, mask of the first copy


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    if x.shape[1] == heads:
        return x
    if heads % x.shape[1]:
        raise ModelError(f"{heads} query heads cannot share {x.shape[1]} key/value heads")
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _causal_fill(module, q, k, mask):
    """Models that skip building a mask for causal attention rely on is_causal."""
    if mask is None and getattr(module, "is_causal", False) and q.shape[-2] > 1:
        n_q, n_k = q.shape[-2], k.shape[-2]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        mask = torch.zeros(n_q, n_k, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~allowed, torch.finfo(q.dtype).min)[None, None]
    return mask


def attattr_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Signature of transformers' attention interface; returns (output [b, q, h, d], weights)."""
    plan = _plan.get()
    softcap = kwargs.get("softcap")
    if kwargs.get("s_aux") is not None:
        raise ModelError("attention sinks (s_aux) are not supported by attattr yet")
    heads = query.shape[1]
    key = _repeat_kv(key, heads)
    value = _repeat_kv(value, heads)
    mask = _causal_fill(module, query, key, attention_mask)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min
        )
    layer = None if plan is None else plan_layer_of(module)

    if isinstance(plan, Record) and layer is not None:
        probs = reference.attention_probs(query, key, mask, scaling, softcap)
        plan.probs[layer] = probs.detach()
        if plan.keep_graph:
            plan.live[layer] = probs
        out = torch.matmul(probs, value)
        if layer in plan.grad_layers:
            z = torch.zeros_like(out, requires_grad=True)
            plan.leaves[layer] = z
            out = out + z
        return out.transpose(1, 2).contiguous(), probs

    if isinstance(plan, Permute) and layer == plan.layer:
        probs = reference.attention_probs(query, key, mask, scaling, softcap)
        index = plan.index.to(probs.device)
        if index.shape[0] != probs.shape[0]:
            index = index.expand(probs.shape[0], *index.shape[1:])
        probs = torch.gather(probs, -1, index)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    if isinstance(plan, Attribute) and layer == plan.layer:
        q1, k1, v1 = query[:1].detach(), key[:1].detach(), value[:1].detach()
        # inputs are never padded, so a causal module's mask is exactly the causal
        # pattern: hand the backend the flag instead of an n x n mask (sliding windows
        # and other patterns keep their mask)
        causal = bool(getattr(module, "is_causal", False)) and kwargs.get("sliding_window") is None \
            and q1.shape[-2] == k1.shape[-2]
        m1 = None if (mask is None or causal) else mask[:1].detach()
        with torch.no_grad():
            ctx = plan.backend.attention_forward(q1, k1, v1, mask=m1, scale=scaling, causal=causal) \
                if softcap is None else torch.matmul(reference.attention_probs(q1, k1, mask[:1] if mask is not None else None, scaling, softcap), v1)
        alphas = plan.alphas.to(device=ctx.device, dtype=ctx.dtype).view(-1, 1, 1, 1)
        leaf = (alphas * ctx).requires_grad_(True)
        plan.leaf = leaf
        plan.called = True
        plan.saved = {"q": q1, "k": k1, "v": v1, "mask": m1, "causal": causal, "scale": scaling,
                      "softcap": softcap}
        return leaf.transpose(1, 2), None

    # plain attention (fused where PyTorch has it)
    if softcap is None:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    probs = reference.attention_probs(query, key, mask, scaling, softcap)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


AttentionInterface.register(IMPLEMENTATION, attattr_attention)
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)

_owner: contextvars.ContextVar[dict[int, int] | None] = contextvars.ContextVar("attattr_owner", default=None)


def plan_layer_of(module) -> int | None:
    owner = _owner.get()
    return None if owner is None else owner.get(id(module))


def _set_impl(model, impl: str) -> dict:
    """Set the attention implementation on every config of the model; return the old ones."""
    old = {}
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and id(cfg) not in old:
            old[id(cfg)] = (cfg, cfg._attn_implementation)
    for cfg, _ in old.values():
        cfg._attn_implementation = impl
    return old


@contextlib.contextmanager
def taken_over(model):
    """Route the model's attention through attattr for the duration of the block.

    Restores the previous attention implementation (and any padding-token setting
    changed for decoders) even when the block raises.
    """
    _, layers = find_layers(model)
    owner = {}
    for i, layer in enumerate(layers):
        for sub in layer.modules():
            owner[id(sub)] = i
    old = _set_impl(model, IMPLEMENTATION)
    cfg = model.config
    old_pad = getattr(cfg, "pad_token_id", None)
    # decoder classifiers refuse batches > 1 without a pad token; -1 never occurs in
    # input ids, so the last token is pooled exactly as at batch 1
    if old_pad is None:
        cfg.pad_token_id = -1
    token = _owner.set(owner)
    try:
        yield layers
    finally:
        _owner.reset(token)
        cfg.pad_token_id = old_pad
        for c, impl in old.values():
            c._attn_implementation = impl


@contextlib.contextmanager
def active(plan):
    token = _plan.set(plan)
    try:
        yield plan
    finally:
        _plan.reset(token)


@contextlib.contextmanager
def replayed_below(layers: torch.nn.ModuleList, target: int, replay, batch: int):
    """Skip layers below ``target``: each returns the clean forward's output of layer
    ``target - 1`` (``replay``), expanded to ``batch`` copies, so layer ``target`` sees the
    same input for every step and nothing below it is recomputed."""

    def expand(obj):
        if torch.is_tensor(obj) and obj.dim() > 0 and obj.shape[0] == 1:
            return obj.expand(batch, *obj.shape[1:])
        if isinstance(obj, tuple):
            return tuple(expand(o) for o in obj)
        return obj

    expanded = expand(replay) if target > 0 else None
    patched = []
    try:
        for i in range(target):
            layers[i].forward = lambda *a, _o=expanded, **k: _o
            patched.append(layers[i])
        yield
    finally:
        for layer in patched:
            del layer.forward


def _is_projection(module) -> bool:
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


@contextlib.contextmanager
def projections_once(layer: torch.nn.Module, plan: Attribute):
    """In the target layer, every row of the batch is the same until its attention has
    run, so the projections called before it (Q, K, V) compute one row and expand it;
    those called after (output projection, MLP) see the alpha-scaled rows as usual."""

    def wrap(module):
        original = type(module).forward

        def forward(x, *args, **kwargs):
            if not plan.called and torch.is_tensor(x) and x.dim() > 1 and x.shape[0] > 1:
                one = original(module, x[:1], *args, **kwargs)
                return one.expand(x.shape[0], *one.shape[1:])
            return original(module, x, *args, **kwargs)

        return forward

    patched = []
    try:
        for module in layer.modules():
            if _is_projection(module):
                module.forward = wrap(module)
                patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward
