"""XLNet as a classifier: relative attention over the content stream, in the model's own code
(docs/models.md, the adapters' table).

XLNet runs its layers sequence-first; while taken over, each layer goes through a :class:`BatchFirst`
proxy (beside the model, not registered in it), so that what attattr replays and records between
layers is batch-first. The scores are ``scale * ((q + r_w) k^T + bd + ef)``: the position term ``bd``
(relative encodings, shifted) and the segment term ``ef`` are fixed given the layer's input, so they
are the bias. The query stream of permutation language modelling and memories are refused."""

from __future__ import annotations

import contextvars

import torch

from ...errors import ModelError
from . import Adapter, blocked_mask, register


def _time_major(out):
    """The 3-D tensors of ``out`` with their first two axes swapped (batch-first <-> sequence-first)."""
    return tuple(o.transpose(0, 1) if torch.is_tensor(o) and o.dim() == 3 else o for o in out)


class BatchFirst(torch.nn.Module):
    """An XLNet layer with batch-first inputs and outputs."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, h, g, *args, **kwargs):
        h, g = h.transpose(0, 1), None if g is None else g.transpose(0, 1)
        return _time_major(type(self.layer).forward(self.layer, h, g, *args, **kwargs))


_MASK: contextvars.ContextVar = contextvars.ContextVar("attattr_xlnet_mask", default=None)


def _pool_last_real_token(model, summary) -> list:
    """XLNet classifiers read the last position; where attattr pads several examples on the
    right into one pass, that is each row's last real token (what the model reads of each
    example alone)."""

    def forward(*args, **kwargs):
        token = _MASK.set(kwargs.get("attention_mask"))
        try:
            return type(model).forward(model, *args, **kwargs)
        finally:
            _MASK.reset(token)

    def pool(hidden_states, cls_index=None):
        mask = _MASK.get()
        if mask is not None and hidden_states.shape[0] == mask.shape[0] and not bool(mask.bool().all()):
            last = mask.long().sum(-1) - 1
            rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
            hidden_states = hidden_states[rows, last.to(hidden_states.device)][:, None]
        return type(summary).forward(summary, hidden_states, cls_index)

    model.forward, summary.forward = forward, pool
    return [lambda: model.__dict__.pop("forward", None), lambda: summary.__dict__.pop("forward", None)]


@register
class XLNet(Adapter):
    model_types = ("xlnet",)
    modules = ("XLNetRelativeAttention",)

    @staticmethod
    def _base(model):
        return getattr(model, "transformer", model)

    def layer_list(self, model):
        base = self._base(model)
        calls = base.__dict__.get("_attattr_layers")
        if calls is None:
            calls = torch.nn.ModuleList([BatchFirst(layer) for layer in base.layer])
            object.__setattr__(base, "_attattr_layers", calls)  # not a registered submodule
        return ("transformer.layer" if base is not model else "layer"), calls

    def install_model(self, model):
        _, calls = self.layer_list(model)
        undo = []
        summary = getattr(model, "sequence_summary", None)
        if summary is not None and getattr(summary, "summary_type", None) == "last":
            undo += _pool_last_real_token(model, summary)
        for layer, proxy in zip(self._base(model).layer, calls):
            layer.forward = (lambda h, g, *a, _p=proxy, **k:
                             _time_major(_p(h.transpose(0, 1), None if g is None else g.transpose(0, 1), *a, **k)))
            undo.append(lambda _l=layer: _l.__dict__.pop("forward", None))
        return undo

    def forward(self, module, attend, h, g, attn_mask_h, attn_mask_g, r, seg_mat, mems=None, target_mapping=None,
                output_attentions=False):
        if g is not None or target_mapping is not None or (mems is not None and mems.dim() > 1):
            raise ModelError("XLNet's two-stream attention (target_mapping, perm_mask) and memories are not"
                             " supported by attattr; it attributes XLNet's content stream, as a classifier uses it")
        n, b = h.shape[:2]
        one = b > 1 and h.stride(1) == 0  # a target layer: every row the same, computed once
        hh, rr = (h[:, :1], r[:, :1]) if one else (h, r)
        seg = seg_mat[:, :, :1] if one and seg_mat is not None else seg_mat
        q = torch.einsum("ibh,hnd->ibnd", hh, module.q)
        k = torch.einsum("ibh,hnd->ibnd", hh, module.k)
        v = torch.einsum("ibh,hnd->ibnd", hh, module.v)
        k_r = torch.einsum("ibh,hnd->ibnd", rr.type(module.r.dtype), module.r)
        bd = module.rel_shift_bnij(torch.einsum("ibnd,jbnd->bnij", q + module.r_r_bias, k_r), klen=n)
        if seg is not None:
            ef = torch.einsum("ibnd,snd->ibns", q + module.r_s_bias, module.seg_embed)
            bd = bd + torch.einsum("ijbs,ibns->bnij", seg, ef)
        bias = bd * module.scale
        q, k, v = ((q + module.r_w_bias).permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3))
        if one:
            q, k, v, bias = (t.expand(b, *t.shape[1:]) for t in (q, k, v, bias))
        mask = None
        if attn_mask_h is not None:  # [query, key, batch, 1], 1 = blocked
            mask = blocked_mask(torch.einsum("ijbn->bnij", attn_mask_h) > 0, q.dtype)
        out, _ = attend(module, q, k, v, mask, scaling=module.scale, position_bias=bias)  # [b, n, h, d]
        return module.post_attention(h, out.transpose(0, 1)), None
