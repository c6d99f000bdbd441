"""attattr's attention function, registered with transformers' attention interface.

While a model runs inside :func:`taken_over`, every self-attention call of every layer comes
here and does what the active plan (:func:`active`) asks: :class:`Record` (the clean forward),
:class:`Attribute` (one target layer's integration pass), :class:`Sweep` (several target layers
in one pass), :class:`Permute` (counterfactual attention), :class:`HeadPatch` (heads as nodes:
gated, patched, masked) and :class:`PatternPath`. Outside a plan (or for layers a plan does not
touch) it is plain attention. Each call is told apart by its *site* ``(family, layer)``
(:mod:`attattr_cli.engine.sites`). Grouped-query attention is handled by repeating K and V per
query head; rotary positions are applied by the model before its attention function is called.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers import masking_utils
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..errors import ModelError
from ..models import adapters, experts
from ..models.adapters.albert import CALL as shared_call
from ..models.arch import attention_module, find_families, find_layers
from ..ops import reference
from .rows import to_device

IMPLEMENTATION = "attattr"

_plan: contextvars.ContextVar[Any] = contextvars.ContextVar("attattr_plan", default=None)


@dataclass
class Record:
    """Clean forward: keep each layer's attention probabilities.

    With ``grad_layers``, the output of those layers' attention gets a zero leaf added
    (``O + z``), so that one backward of the clean forward gives dF/dO at alpha = 1 for
    every layer at once (the alpha = 1 step is the same point for every target layer).
    """

    probs: dict = field(default_factory=dict)  # site -> [1, head, q, k] ("maps") or [1, q, k] ("mean")
    grad_layers: frozenset = frozenset()  # sites
    leaves: dict = field(default_factory=dict)  # site -> zero leaf
    keep: str | None = "maps"  # what of the probabilities to keep: "maps", "mean" or None
    keep_graph: bool = False  # also keep the probabilities with their graph in ``live`` (site -> tensor)
    live: dict = field(default_factory=dict)
    called: set = field(default_factory=set)  # sites whose attention has run in this forward


def several_maps(model_type: str, site) -> ModelError:
    """The one line for a layer whose attention runs more than once in one forward (differential
    attention's two softmaxes, or a looped model running its layers again): attattr's map of a
    layer is one softmax, so no one map would be right."""
    return ModelError(f"model type '{model_type}' computes attention more than once in {site[0]} layer {site[1]} in"
                      " one forward (several maps combined, as differential attention does, or layers run again, as"
                      " a looped model does), and attattr's map of a layer is one softmax; see docs/models.md for"
                      " the supported architectures")


@dataclass
class Permute:
    """Counterfactual attention (Jain & Wallace 2019): at site ``(family, layer)`` every batch
    row b uses the attention probabilities of the clean input with each (head, query) row's
    weights moved to other keys, ``A'[b, h, i, j] = A[b, h, i, index[b, h, i, j]]``.

    ``index``: [batch, head, query_pos, key_pos] long, a permutation of the key positions
    in every row. Every other layer computes its attention normally.
    """

    layer: int
    index: torch.Tensor
    family: str = "self"

    @property
    def site(self) -> tuple[str, int]:
        return (self.family, self.layer)


@dataclass
class Attribute:
    """One chunk of integration steps for one target layer: the batch holds one copy of the
    example per step; the layers below the target are replayed from the clean forward, the
    target computes A and A V once from the first copy and returns ``alpha_k * (A V)`` for
    step k as a leaf whose gradient is dF/dO_k, and the layers above run as usual."""

    layer: int
    alphas: torch.Tensor  # [chunk]
    backend: Any
    family: str = "self"
    leaf: torch.Tensor | None = None  # [chunk, head, query_pos, d_head], requires grad
    called: bool = False  # the target layer's attention has run in this pass
    saved: dict[str, Any] = field(default_factory=dict)  # q, k, v, mask of the first copy
    # several examples in one pass (engine/grouped.py): the rows of each example are
    # consecutive; ``first`` [examples] is the first row of each, ``local`` [rows] the
    # example (0..examples-1) of each row. None: every row is the same example.
    first: torch.Tensor | None = None
    local: torch.Tensor | None = None
    owner: torch.Tensor | None = None  # [rows] the example of each row within the clean forward's batch

    @property
    def site(self) -> tuple[str, int]:
        return (self.family, self.layer)


@dataclass
class Sweep:
    """One pass for several target layers of one attention family (engine/sweep.py): row r of
    the batch is the integral of target layer ``row_layer[r]`` at ``alphas[r]``, rows ordered
    by layer. Inside :func:`swept`, ``rows_now`` are the rows layer j runs and ``leaves[j]`` the
    leaf of the rows targeting j (its projections in ``saved[j]``), as engine/sweep.py says."""

    family: str
    row_layer: torch.Tensor  # [rows] long, ascending
    alphas: torch.Tensor  # [rows]
    backend: Any
    rows_now: torch.Tensor | None = None  # the batch rows of the layer running now
    leaves: dict = field(default_factory=dict)  # layer -> leaf [its rows, head, query, d]
    saved: dict = field(default_factory=dict)  # layer -> its saved projections (as Attribute.saved)
    layer_now: int | None = None  # the layer whose rows are ``rows_now``

    def __post_init__(self) -> None:
        """Which rows run which layer, known on the host: kept as Python ints and index tensors
        made before the forward, so that no layer of the pass waits for the device (issue 53:
        no ``nonzero``, ``any()`` or boolean-mask indexing inside a pass)."""
        self.host_layers = tuple(int(x) for x in self.row_layer.tolist())
        layers = self.host_layers
        self.targets = frozenset(layers)
        self.below: dict = {}  # j -> (rows at or below j on the host, the same on the device)
        self.split: dict = {}  # j -> (rows targeting j, the other rows: positions in below[j]; their alpha rows)
        if not layers:
            return
        lists, keys = [], []
        for j in range(min(layers), max(layers) + 1):
            rows = [r for r, layer in enumerate(layers) if layer <= j]
            self.below[j] = torch.tensor(rows, dtype=torch.long)
            if len(rows) < len(layers):
                keys.append(("rows", j))
                lists.append(rows)
            if j in self.targets:
                keys += [("t", j), ("o", j), ("alpha", j)]
                lists += [[p for p, r in enumerate(rows) if layers[r] == j],
                          [p for p, r in enumerate(rows) if layers[r] != j],
                          [r for r in rows if layers[r] == j]]
        flat = to_device(torch.tensor([x for each in lists for x in each], dtype=torch.long), self.alphas.device)
        made = dict(zip(keys, flat.split([len(each) for each in lists])))  # (one host-to-device copy)
        for j, host in self.below.items():
            self.below[j] = (host, made.get(("rows", j)))
            if j in self.targets:
                self.split[j] = (made[("t", j)], made[("o", j)], made[("alpha", j)])

    def rows_at(self, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(host, device) indices of the rows whose target is at or below layer ``j`` (device:
        None where that is every row)."""
        if j in self.below:
            return self.below[j]
        rows = [r for r, layer in enumerate(self.host_layers) if layer <= j]
        if len(rows) < len(self.host_layers):  # (below the lowest target: a layer a sweep replays)
            return torch.tensor(rows, dtype=torch.long), torch.tensor(rows, dtype=torch.long, device=self.alphas.device)
        return torch.arange(len(rows)), None


@dataclass
class HeadPatch:
    """Head outputs as nodes of a circuit: record them, gate them, patch them.

    A head's output is ``z_h = A_h V_h`` ([batch, head, query, d], before the linear output
    projection, so replacing z_h replaces exactly the head's contribution).

    - ``source`` (layer -> [1 or batch, head, query, d]) and ``gate`` ([batch, layer, head] or
      [layer, head]): each head's output becomes ``source + gate * (z - source)``: gate 1 keeps
      the head, 0 patches it, values between interpolate. Without ``source`` the source is zero
      (head masking, :func:`HeadScale`); a ``source`` without a layer's key leaves that layer as it is.
    - ``record``: filled with each layer's (gated) output, with its graph, so that gradients
      with respect to head outputs can be taken (``torch.autograd.grad``).
    - ``probs``: filled with each layer's attention probabilities when ``want_probs``.
    """

    source: dict | None = None
    gate: torch.Tensor | None = None
    record: dict | None = None
    leaves: dict | None = None  # filled with a zero leaf added to each layer's output: d/d leaf = d/d z
    want_probs: bool = False
    probs: dict = field(default_factory=dict)
    values: dict | None = None  # filled with each layer's values [batch, head, key, d] (key/value heads repeated)


def HeadScale(scale: torch.Tensor) -> HeadPatch:
    """Head masking: each head's output times ``scale[layer, head]`` (or ``[batch, layer, head]``
    one row per example): a :class:`HeadPatch` with a zero source."""
    return HeadPatch(gate=scale)


@dataclass
class PatternPath:
    """Each batch row interpolates one layer's attention pattern (all its heads) between a
    baseline and the live pattern: ``A(alpha) = A' + alpha (A - A')`` for the rows whose
    ``target`` is that layer, every other layer plain. ``source`` (layer -> [1 or batch, head,
    query, key]) is the baseline A' (zeros: the paper's path; the counterfactual run's
    pattern: the counterfactual path). ``leaves`` is filled with a zero leaf added to the
    interpolated pattern of each targeted layer ([rows of that layer, head, query, key]), so
    that the gradient with respect to the pattern is the gradient with respect to the leaf;
    ``delta`` with ``A - A'`` of those rows."""

    target: torch.Tensor  # [batch] layer index of each row
    alpha: torch.Tensor  # [batch]
    source: dict
    leaves: dict = field(default_factory=dict)
    delta: dict = field(default_factory=dict)


def _pattern_path(plan: PatternPath, layer: int, query, key, value, mask, scaling, softcap):
    rows = (plan.target == layer).nonzero().flatten()
    if rows.numel() == 0:
        return None
    probs = reference.attention_probs(query, key, mask, scaling, softcap)
    src = plan.source[layer].to(probs)
    src = src if src.shape[0] == 1 else src[rows]
    live = probs[rows]
    a = plan.alpha[rows].to(probs).view(-1, 1, 1, 1)
    leaf = torch.zeros_like(live, requires_grad=True)
    plan.leaves[layer], plan.delta[layer] = leaf, (live - src).detach()
    mixed = src + a * (live - src) + leaf
    probs = probs.index_put((rows,), mixed)
    return torch.matmul(probs, value)


def _head_patch(plan: HeadPatch, layer: int, out: torch.Tensor) -> torch.Tensor:
    def heads(g):  # [rows, head, 1, 1]; one more column than heads is the layer's MLP node (analysis/circuits/task.py)
        g = (g[layer].view(1, -1, 1, 1) if g.dim() == 2 else g[:, layer].view(g.shape[0], -1, 1, 1))
        if g.shape[1] == out.shape[1] + 1:
            g = g[:, :out.shape[1]]
        if g.shape[1] != out.shape[1]:
            raise ModelError(f"head gate has {g.shape[1]} heads for layer {layer}, the model {out.shape[1]}")
        return g

    return patch_node(plan, layer, out, heads)


def patch_node(plan: HeadPatch, key, out: torch.Tensor, gate_of) -> torch.Tensor:
    """A node's output under ``plan``: a zero leaf added (``plan.leaves[key]``), moved towards
    ``plan.source[key]`` by its gate (``gate_of(plan.gate)``, broadcastable to ``out``; no gate:
    the source itself), and kept in ``plan.record[key]``. The heads of a layer (key: the layer)
    and, in a circuit, a layer's MLP (key ``("mlp", layer)``)."""
    if plan.leaves is not None:
        leaf = torch.zeros_like(out, requires_grad=True)
        plan.leaves[key] = leaf
        out = out + leaf
    if plan.source is None and plan.gate is not None:  # a zero source: the gate scales the node
        out = out * gate_of(plan.gate).to(device=out.device, dtype=out.dtype)
    elif plan.source is not None and key in plan.source:
        src = plan.source[key].to(device=out.device, dtype=out.dtype)
        if plan.gate is None:
            out = src.expand_as(out)
        else:
            out = src + gate_of(plan.gate).to(device=out.device, dtype=out.dtype) * (out - src)
    if plan.record is not None:
        plan.record[key] = out
    return out


def repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    if x.shape[1] == heads:
        return x
    if heads % x.shape[1]:
        raise ModelError(f"{heads} query heads cannot share {x.shape[1]} key/value heads")
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def causal_fill(module, q, k, mask):
    """Models that skip building a mask for causal attention rely on is_causal."""
    if mask is None and getattr(module, "is_causal", False) and q.shape[-2] > 1:
        n_q, n_k = q.shape[-2], k.shape[-2]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        mask = torch.zeros(n_q, n_k, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~allowed, torch.finfo(q.dtype).min)[None, None]
    return mask


def _is_causal_mask(mask: torch.Tensor | None) -> bool:
    """True when an additive mask (every batch row) blocks exactly the keys after the query.
    A mask :func:`attattr_mask` made and knew causal on the host is not asked (issue 53: a
    pass's layers do not wait for the device); any other is compared on the device."""
    if mask is None:
        return True
    if getattr(mask, "_attattr_causal", False):
        return True
    n_q, n_k = mask.shape[-2], mask.shape[-1]
    if n_q != n_k:
        return False
    upper = torch.ones(n_q, n_k, dtype=torch.bool, device=mask.device).triu(1)
    blocked = mask <= torch.finfo(mask.dtype).min / 2 if mask.is_floating_point() else ~mask.bool()
    return bool((blocked == upper).all())


def fold_bias(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float | None):
    """(q', k') with ``q'_i . k'_j = scale * q_i . k_j + bias[i, j]`` per head (use scale 1):
    an additive score bias that depends on positions (T5's relative buckets, ALiBi, DeBERTa's
    disentangled terms) carried as n more dimensions of the projections, so that a target
    layer's attention is again ``softmax(q' k'^T + mask)`` for everything that recomputes A
    from its saved projections. ``bias``: broadcastable to [batch, head, query, key], finite."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bias = bias.to(q.dtype).expand(b, h, n_q, n_k)
    eye = torch.eye(n_q, dtype=q.dtype, device=q.device).expand(b, h, n_q, n_q)
    return torch.cat([q * scale, eye], -1), torch.cat([k, bias.transpose(-1, -2)], -1)


def with_sink(query, key, value, mask, scaling, sink, causal_module: bool):
    """An attention sink (a learned logit per head in the softmax's denominator, gpt-oss's
    ``s_aux``) as one more key: ``q' = [scale * q, 1]``, ``k'_j = [k_j, 0]``, the sink key
    ``[0, s_h]`` with value 0, so that ``softmax(q' k'^T + mask)`` over n + 1 keys is the
    model's attention, its first n columns the probabilities of the real keys (rows sum to
    less than 1) and its output ``A V`` unchanged. Returns (q', k', v', mask', scale 1); the
    mask becomes explicit (causal where the module is, the sink column open)."""
    b, h, n_q, d = query.shape
    n_k = key.shape[-2]
    scale = d ** -0.5 if scaling is None else scaling
    s = sink.to(query.dtype).reshape(1, -1, 1, 1).expand(b, h, 1, 1)
    q = torch.cat([query * scale, query.new_ones(b, h, n_q, 1)], -1)
    k = torch.cat([torch.cat([key, key.new_zeros(b, h, n_k, 1)], -1),
                   torch.cat([key.new_zeros(b, h, 1, d), s], -1)], -2)
    v = torch.cat([value, value.new_zeros(b, h, 1, value.shape[-1])], -2)
    if mask is None and causal_module and n_q > 1:
        mask = causal_fill(_Causal, query, key, None)
    if mask is not None:
        mask = mask.to(query.dtype)
        mask = torch.cat([mask, mask.new_zeros(*mask.shape[:-1], 1)], -1)
    return q, k, v, mask, 1.0


def attattr_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Signature of transformers' attention interface; returns (output [b, q, h, d], weights).

    ``position_bias`` (T5's keyword; also what the adapters of models/adapters pass): an
    additive score bias [batch or 1, head, query, key] added to ``scaling * q k^T`` before the
    mask. The target layer's saved projections carry it (:func:`fold_bias`)."""
    plan = _plan.get()
    softcap = kwargs.get("softcap")
    bias = kwargs.get("position_bias")
    sink = kwargs.get("s_aux")
    if sink is not None and (softcap is not None or bias is not None):
        raise ModelError("attention sinks (s_aux) together with a soft cap or a position bias are not supported by"
                         " attattr yet; see docs/models.md for the supported architectures")
    heads = query.shape[1]
    key = repeat_kv(key, heads)
    value = repeat_kv(value, heads)
    mask = causal_fill(module, query, key, attention_mask)
    if mask is not None and mask.dtype == torch.bool:
        blocked = torch.finfo(query.dtype).min
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, blocked)
    if sink is not None:  # the sink as one more key; every path below sees n + 1 keys
        d_value = value.shape[-1]
        query, key, value, mask, scaling = with_sink(query, key, value, mask, scaling, sink,
                                                     bool(getattr(module, "is_causal", False)))
        out = _sink_attention(plan, module, query, key, value, mask, d_value)
        if out is not None:
            return out
    site = None if plan is None else plan_site_of(module)
    # where a causal module's mask is exactly the causal pattern (attattr never pads its
    # inputs), use the flag instead of an n x n mask, so fused attention can run
    causal = bool(getattr(module, "is_causal", False)) and kwargs.get("sliding_window") is None \
        and query.shape[-2] == key.shape[-2] and query.shape[-2] > 1 and _is_causal_mask(mask) and bias is None
    if bias is not None and mask is None and getattr(module, "is_causal", False) and query.shape[-2] > 1:
        mask = causal_fill(_Causal, query, key, None)
    bare_mask = mask  # without the bias: what the target layer saves
    if bias is not None:
        bias = bias.to(query.dtype)
        mask = bias if mask is None else mask + bias

    if isinstance(plan, Record) and site is not None:
        if plan.keep_graph:  # probabilities with their graph: gradients with respect to A
            probs = reference.attention_probs(query, key, mask, scaling, softcap)
            out = torch.matmul(probs, value)
        else:
            probs = None
            if plan.keep is not None or softcap is not None:
                with torch.no_grad():
                    probs = reference.attention_probs(query, key, mask, scaling, softcap)
            out = _plain_attention(query, key, value, mask, scaling, softcap, causal)
        # as wide as the target pass's output (with a bias: padded, see the Attribute branch)
        width = out.shape[-1] if bias is None else query.shape[-1] + query.shape[-2]
        return _recorded(plan, module, site, probs, out, width).transpose(1, 2).contiguous(), None

    if isinstance(plan, Permute) and site == plan.site:
        probs = _permuted(plan, reference.attention_probs(query, key, mask, scaling, softcap))
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    if isinstance(plan, Attribute) and site == plan.site:
        if sink is not None and plan.first is not None:  # (decoders, the models with sinks, are never grouped)
            raise ModelError("attention sinks are scored one example per pass: pass --group 1")
        first = slice(0, 1) if plan.first is None else plan.first.to(query.device)
        leaf, plan.saved, d_out = _target_leaf(plan.backend, plan.alphas, first, plan.local, query, key, value,
                                               bare_mask, bias, scaling, softcap, sink is not None, causal)
        plan.leaf = leaf
        plan.called = True
        # contiguous, as the interface's other paths return it: models .view it (afmoe, jetmoe, dory)
        return leaf[..., :d_out].transpose(1, 2).contiguous(), None

    if isinstance(plan, Sweep) and site is not None and site[0] == plan.family and sink is None:
        out = _swept_layer(plan, site[1], query, key, value, mask, bare_mask, bias, scaling, softcap, causal)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None

    if isinstance(plan, PatternPath) and site is not None and site[0] in ("self", "encoder"):
        out = _pattern_path(plan, site[1], query, key, value, mask, scaling, softcap)
        if out is None:
            out = _plain_attention(query, key, value, mask, scaling, softcap, causal)
        return out.transpose(1, 2).contiguous(), None

    if isinstance(plan, HeadPatch) and site is not None and site[0] in ("self", "encoder"):
        if plan.want_probs:
            probs = plan.probs[site[1]] = reference.attention_probs(query, key, mask, scaling, softcap)
            out = torch.matmul(probs, value)
        else:  # (with a soft cap: the probabilities times V, as the model computes it)
            out = _plain_attention(query, key, value, mask, scaling, softcap, causal)
        if plan.values is not None:
            plan.values[site[1]] = value
        return _head_patch(plan, site[1], out).transpose(1, 2).contiguous(), None

    # plain attention (fused where PyTorch has it)
    if softcap is None:
        return _plain_attention(query, key, value, mask, scaling, softcap, causal).transpose(1, 2).contiguous(), None
    probs = reference.attention_probs(query, key, mask, scaling, softcap)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _recorded(plan: Record, module, site, probs, out: torch.Tensor, width: int) -> torch.Tensor:
    """A Record's bookkeeping of one site's attention (``probs``: its probabilities, with their
    graph where ``keep_graph``; None where neither kept nor made): the site marked as run (a
    second run in one forward is :func:`several_maps`), the probabilities kept, and, for a site
    in ``grad_layers``, a zero leaf ``width`` wide added to ``out``."""
    if site in plan.called:  # one site, two softmaxes combined: no one map to attribute
        raise several_maps(getattr(getattr(module, "config", None), "model_type", "?"), site)
    plan.called.add(site)
    if plan.keep_graph:
        plan.live[site] = probs
    if plan.keep == "maps":
        plan.probs[site] = probs.detach()
    elif plan.keep == "mean":
        plan.probs[site] = probs.detach().float().mean(1)
    if site in plan.grad_layers:
        z = out.new_zeros(*out.shape[:-1], width).requires_grad_(True)
        plan.leaves[site] = z
        out = out + z[..., :out.shape[-1]]
    return out


def _permuted(plan: Permute, probs: torch.Tensor) -> torch.Tensor:
    """``probs`` with each row's weights moved to other keys by ``plan.index``."""
    index = plan.index.to(probs.device)
    if index.shape[0] != probs.shape[0]:
        index = index.expand(probs.shape[0], *index.shape[1:])
    return torch.gather(probs, -1, index)


def _target_leaf(backend, alphas, first, local, query, key, value, bare_mask, bias, scaling, softcap,
                 sink: bool, causal: bool):
    """The target layer's rows of a pass: A V of the clean input (the rows ``first`` of the batch,
    one per example; ``local`` [rows] the example of each row, None: one example) times each
    row's alpha, as a leaf whose gradient is dF/dO. Returns (leaf, saved projections, d_out)."""
    q1, k1, v1 = query[first].detach(), key[first].detach(), value[first].detach()
    if bare_mask is not None and bare_mask.shape[0] == 1:  # one mask for every row (a sweep's target rows are not first)
        bare_mask = bare_mask.expand(query.shape[0], *bare_mask.shape[1:])
    m1 = None if (bare_mask is None or causal) else bare_mask[first].detach()
    d_out = v1.shape[-1]
    if bias is not None:
        b1 = bias if bias.shape[0] == 1 else bias[first]
        q1, k1 = fold_bias(q1, k1, b1.detach(), scaling)
        scaling = 1.0
    if sink or bias is not None:
        # values padded with zeros to q's width (the sink's dimension, the folded bias): [A V, 0],
        # whose extra columns the model never reads (their gradient is 0), so A * (G V^T) is
        # unchanged and every backend sees q, k and v of one shape
        v1 = torch.cat([v1, v1.new_zeros(*v1.shape[:-1], q1.shape[-1] - d_out)], -1)
    with torch.no_grad():
        ctx = backend.attention_forward(q1, k1, v1, mask=m1, scale=scaling, causal=causal) \
            if softcap is None else torch.matmul(reference.attention_probs(
                q1, k1, bare_mask[first] if bare_mask is not None else None, scaling, softcap), v1)
    if local is not None:  # each row takes its example's A V
        ctx = ctx.index_select(0, local.to(ctx.device))
    alphas = alphas.to(device=ctx.device, dtype=ctx.dtype).view(-1, 1, 1, 1)
    leaf = (alphas * ctx).requires_grad_(True)
    saved = {"q": q1, "k": k1, "v": v1, "mask": m1, "causal": causal, "scale": scaling,
             "softcap": softcap, "sink": sink}
    return leaf, saved, d_out


def _plain_attention(query, key, value, mask, scaling, softcap, causal) -> torch.Tensor:
    """Attention as the model computes it ([batch, head, query, d]; fused where PyTorch has it)."""
    if softcap is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=None if causal else mask,
                                              scale=scaling, is_causal=causal)
    return torch.matmul(reference.attention_probs(query, key, mask, scaling, softcap), value)


def _swept_layer(plan, layer: int, query, key, value, mask, bare_mask, bias, scaling, softcap, causal):
    """Layer ``layer`` in a sweep (:class:`Sweep`): its batch is the rows whose target layer is at or
    below it (:func:`swept`); those targeting it get the alpha-scaled leaf of the clean input,
    the others plain attention of their own input. [batch, head, query, d], or None where no
    row targets this layer (plain attention then)."""
    rows = plan.rows_now
    if rows is None or len(rows) != query.shape[0]:
        return None
    if layer not in plan.targets:  # no row targets this layer: known on the host
        return None
    if plan.layer_now == layer:  # the index tensors made with the sweep, nothing asked of the device
        t, o, alpha_rows = plan.split[layer]
        t, o = t.to(query.device), o.to(query.device) if len(o) else None
        alphas = plan.alphas.index_select(0, alpha_rows)
    else:
        is_target = plan.row_layer.index_select(0, rows) == layer
        if not bool(is_target.any()):
            return None
        t = torch.nonzero(is_target).flatten().to(query.device)
        alphas = plan.alphas.index_select(0, rows.to(plan.alphas.device))[is_target.to(plan.alphas.device)]
        o = torch.nonzero(~is_target).flatten().to(query.device) if len(t) < query.shape[0] else None
    # the target rows t as a leaf at their alphas, the other rows o (None: none) plain attention
    leaf, saved, d_out = _target_leaf(plan.backend, alphas, t[:1], None, query, key, value, bare_mask, bias,
                                      scaling, softcap, False, causal)
    plan.leaves[layer] = leaf
    plan.saved[layer] = saved
    out = leaf[..., :d_out]
    if o is not None:
        m = mask if (mask is None or mask.shape[0] == 1) else mask.index_select(0, o)
        plain = _plain_attention(query.index_select(0, o), key.index_select(0, o), value.index_select(0, o), m,
                                 scaling, softcap, causal)
        out = plain.new_zeros(query.shape[0], *plain.shape[1:]).index_copy(0, t, out.to(plain.dtype)) \
            .index_copy(0, o, plain)
    return out


class _Causal:
    is_causal = True


def _sink_attention(plan, module, query, key, value, mask, d_value):
    """The paths for attention with a sink key appended (:func:`with_sink`; scale 1, an explicit
    mask, no bias): (output, probabilities of the real keys), or None for the target layer of
    an attribution (the Attribute path of :func:`attattr_attention` runs it, its saved
    projections carrying the sink)."""
    site = None if plan is None else plan_site_of(module)
    if isinstance(plan, Attribute) and site == plan.site:
        return None
    probs = reference.attention_probs(query, key, mask, 1.0, None)
    out = torch.matmul(probs, value)
    real = probs[..., :-1]
    if isinstance(plan, Record) and site is not None:  # as wide as the target pass's output (v padded to q's)
        out = _recorded(plan, module, site, real, out, max(query.shape[-1], out.shape[-1]))
    elif isinstance(plan, Permute) and site == plan.site:
        real = _permuted(plan, real)
        out = torch.matmul(real, value[..., :-1, :])
    elif isinstance(plan, HeadPatch) and site is not None and site[0] in ("self", "encoder"):
        out = _head_patch(plan, site[1], out)
    return out.transpose(1, 2).contiguous(), real


def _zero(x) -> bool:
    return isinstance(x, int) and x == 0


def attattr_mask(*args, **kwargs):
    """transformers' eager mask (the mask interface attattr registers), marked
    ``_attattr_causal`` where its arguments say on the host that it is exactly causal: the
    plain causal pattern (no padding, packing, window or other mask function combined), no
    offsets, as many queries as keys. :func:`_is_causal_mask` reads the mark instead of
    comparing the mask on the device; a mask without it (a slice of it, too) is compared."""
    mask = eager_mask(*args, **kwargs)
    if (mask is not None and not args and kwargs.get("mask_function", masking_utils.causal_mask_function)
            is masking_utils.causal_mask_function and kwargs.get("attention_mask") is None
            and _zero(kwargs.get("q_offset", 0)) and _zero(kwargs.get("kv_offset", 0))
            and isinstance(kwargs.get("q_length"), int) and kwargs.get("q_length") == kwargs.get("kv_length")
            and tuple(mask.shape[-2:]) == (kwargs["q_length"], kwargs["kv_length"])):
        mask._attattr_causal = True
    return mask


AttentionInterface.register(IMPLEMENTATION, attattr_attention)
AttentionMaskInterface.register(IMPLEMENTATION, attattr_mask)

_owner: contextvars.ContextVar[dict | None] = contextvars.ContextVar("attattr_owner", default=None)


def plan_site_of(module) -> tuple[str, int] | None:
    """The (family, layer) of an attention module while a model is taken over (for a module
    shared by several layers: the layer of the call running now)."""
    owner = _owner.get()
    site = None if owner is None else owner.get(id(module))
    if site is not None and site[1] is None:
        layer = shared_call.get()
        return None if layer is None else (site[0], layer)
    return site


def site_owner(model) -> dict[int, tuple[str, int]]:
    """id(module) -> (family, layer) for every module inside the model's attention sites."""
    owner: dict[int, tuple[str, int]] = {}
    families = find_families(model)
    for name, _path, attn, layers in sorted(families, key=lambda f: f[2] is not None):
        shared = getattr(layers, "shared_calls", False)  # one module called as every layer
        for i, layer in enumerate(layers):
            for sub in attention_module(layer, attn).modules():
                owner[id(sub)] = (name, None if shared else i)
    return owner


def set_impl(model, impl: str) -> dict:
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
    changed for decoders, the forwards an adapter of models/adapters replaced, the experts
    implementation of a float64 mixture-of-experts model) even when the block raises.
    """
    undo = adapters.install(model, attattr_attention)  # attention outside the interface
    try:
        _, layers = find_layers(model)
        owner = site_owner(model)
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    old = set_impl(model, IMPLEMENTATION)
    float64 = getattr(next(model.parameters(), None), "dtype", None) == torch.float64
    changed = experts.eager_experts(model) if float64 else []  # grouped experts take no float64
    cfg = model.config
    old_pad = getattr(cfg, "pad_token_id", None)
    # decoder classifiers refuse batches > 1 without a pad token; -1 never occurs in
    # input ids, so the last token is pooled exactly as at batch 1
    if old_pad is None:
        cfg.pad_token_id = -1
    token = _owner.set(owner)
    packed = _packed.set({})
    original_packed = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original_packed is not None:
        masking_utils.find_packed_sequence_indices = _packed_sequences(original_packed)
    quieted = _quiet_padding_checks(model)
    try:
        yield layers
    finally:
        for module in quieted:
            module.__dict__.pop(_PADDING_CHECK, None)
        if original_packed is not None:
            masking_utils.find_packed_sequence_indices = original_packed
        _packed.reset(packed)
        _owner.reset(token)
        for step in reversed(undo):
            step()
        experts.restore(changed)
        cfg.pad_token_id = old_pad
        for c, impl in old.values():
            c._attn_implementation = impl


_packed: contextvars.ContextVar[dict | None] = contextvars.ContextVar("attattr_packed", default=None)


def _packed_sequences(original):
    """transformers' packed-sequence check of the position ids (a host synchronisation in every
    forward without a mask), asked once per width and example: an integration pass's rows are
    copies of the clean forward's input, and a clean forward run again (a captured one's
    warm-up, then its capture) has the same input, so where the first clean forward found no
    packed sequences at this width, these do not ask the device again (issue 53). Any other
    forward (and any width not seen) runs the check."""
    def find(position_ids, *args, **kwargs):
        seen = _packed.get()
        plan = _plan.get()
        key = tuple(position_ids.shape[1:]) if torch.is_tensor(position_ids) else None
        if seen is not None and key is not None and isinstance(plan, (Attribute, Sweep, Record)) \
                and seen.get(key) is None and key in seen:
            return None
        out = original(position_ids, *args, **kwargs)
        if seen is not None and key is not None and isinstance(plan, Record):
            seen[key] = None if out is None else "packed"
        return out
    return find


def packed_answers() -> dict:
    """What this example's forwards found of packed sequences so far (width -> None or
    "packed"; :func:`_packed_sequences`): a captured clean forward keeps it with its graph."""
    return dict(_packed.get() or {})


def learn_packed(answers: dict) -> None:
    """Take ``answers`` (:func:`packed_answers` of a captured clean forward of this width) as this
    example's own: a replayed clean forward runs no Python, and its passes would ask again."""
    seen = _packed.get()
    if seen is not None:
        for key, value in answers.items():
            seen.setdefault(key, value)


_PADDING_CHECK = "warn_if_padding_and_no_attention_mask"


def _quiet_padding_checks(model) -> list:
    """transformers' check for a padding token in the input ids (a warning; a host
    synchronisation in every forward of some models, GPT-2's) skipped inside integration
    passes, whose rows are copies of the clean forward's input, checked there. Returns the
    modules whose check was wrapped (their instance attribute, removed afterwards)."""
    wrapped = []
    for module in model.modules():
        original = getattr(module, _PADDING_CHECK, None)
        if original is None or not callable(original) or _PADDING_CHECK in module.__dict__:
            continue

        def check(*args, _original=original, **kwargs):
            if isinstance(_plan.get(), (Attribute, Sweep)) or _checked.get():
                return None
            return _original(*args, **kwargs)

        module.__dict__[_PADDING_CHECK] = check
        wrapped.append(module)
    return wrapped


_checked: contextvars.ContextVar[bool] = contextvars.ContextVar("attattr_checked", default=False)


@contextlib.contextmanager
def checked_on_host(model, input_ids: list):
    """transformers' padding check (:func:`_quiet_padding_checks`) run once on the host's copy of
    the example's ids, and skipped in the forwards inside: a captured clean forward (its warm-up
    and capture) reads nothing back from the device."""
    check = getattr(model, _PADDING_CHECK, None)
    if callable(check):
        check(torch.tensor([input_ids]), None)
    token = _checked.set(True)
    try:
        yield
    finally:
        _checked.reset(token)


def is_taken_over() -> bool:
    """True inside :func:`taken_over` (plans are applied)."""
    return _owner.get() is not None


@contextlib.contextmanager
def active(plan):
    token = _plan.set(plan)
    try:
        yield plan
    finally:
        _plan.reset(token)


@contextlib.contextmanager
def patched_forwards(pairs):
    """Each ``(module, forward)`` of ``pairs`` (read as the patches are made) the module's
    instance ``forward`` inside; each module's own instance attribute (or none) back after,
    even where the block or a later pair raises."""
    restore = []
    try:
        for module, forward in pairs:
            restore.append((module, module.__dict__.get("forward")))
            module.forward = forward
        yield
    finally:
        for module, had in reversed(restore):
            if had is None:
                del module.forward
            else:
                module.forward = had


@contextlib.contextmanager
def replayed_below(layers: torch.nn.ModuleList, target: int, replay, batch: int,
                   owner: torch.Tensor | None = None):
    """Skip layers below ``target``: each returns the clean forward's output of layer
    ``target - 1`` (``replay``), expanded to ``batch`` copies, so layer ``target`` sees the
    same input for every step and nothing below it is recomputed. With ``owner`` ([batch]),
    the clean forward ran several examples and row r of the pass takes example owner[r]'s."""

    def expand(obj):
        if torch.is_tensor(obj) and obj.dim() > 0 and owner is not None:
            return obj.index_select(0, owner.to(obj.device))
        if torch.is_tensor(obj) and obj.dim() > 0 and obj.shape[0] == 1:
            return obj.expand(batch, *obj.shape[1:])
        if torch.is_tensor(obj) and obj.dim() == 4 and obj.shape[1] == 1:  # [streams, batch, tokens, features]:
            return obj.expand(obj.shape[0], batch, *obj.shape[2:])         # Gemma 3n's AltUp predictions
        if isinstance(obj, tuple):
            return tuple(expand(o) for o in obj)
        return obj

    expanded = expand(replay) if target > 0 else None
    with patched_forwards((layers[i], lambda *a, _o=expanded, **k: _o) for i in range(target)):
        yield


class NotSweepable(Exception):
    """A sweep found the model's layers other than it needs them (a target layer's attention
    did not run through the sweep, or a layer's output is not its hidden states): the caller
    scores the family one target layer per pass instead."""


def shapes_of(obj):
    """The shapes of a layer's argument (tensors; tuples of them), None for anything else."""
    if torch.is_tensor(obj):
        return tuple(obj.shape)
    if isinstance(obj, (tuple, list)):
        return tuple(shapes_of(o) for o in obj)
    return None


def _rows_of(obj, clean_shape, idx: torch.Tensor, batch: int):
    """A layer's argument ``obj`` in a sweep cut to the batch rows ``idx``: a tensor whose shape
    in the clean forward (batch 1) was ``clean_shape`` and is that with ``batch`` rows first
    now; unchanged where its shape is the clean forward's (positions, rotary tables, relative
    embeddings). Any other change of shape: the batch is not the first axis (NotSweepable)."""
    if torch.is_tensor(obj):
        shape = tuple(obj.shape)
        if clean_shape is None or shape == tuple(clean_shape):
            return obj
        if len(shape) == len(clean_shape) and clean_shape[0] == 1 and shape[0] == batch \
                and shape[1:] == tuple(clean_shape[1:]):
            rows = obj.index_select(0, idx.to(obj.device))
            if getattr(obj, "_attattr_causal", False):  # some rows of a causal mask: causal (attattr_mask)
                rows._attattr_causal = True
            return rows
        raise NotSweepable(f"an argument of shape {shape} (clean forward: {tuple(clean_shape)}) has no batch axis first")
    if isinstance(obj, (tuple, list)) and isinstance(clean_shape, tuple) and len(clean_shape) == len(obj):
        return type(obj)(_rows_of(o, c, idx, batch) for o, c in zip(obj, clean_shape))
    return obj


@contextlib.contextmanager
def swept(layers: torch.nn.ModuleList, plan: Sweep, outputs: dict, batch: int, arg_shapes: dict):
    """The layers of one sweep (:class:`Sweep`): below the lowest target layer, the clean
    forward's output is replayed (:func:`replayed_below`); layer j at or above it runs the rows
    whose target layer is at most j and returns the clean output of layer j (``outputs[j]``)
    for the others, whose input is still clean there. ``arg_shapes[j]``: the shapes of layer
    j's arguments in the clean forward (which of them carry the batch, :func:`_rows_of`)."""
    lowest = min(plan.host_layers)

    def wrap(layer, j):
        original = layer.forward
        idx, on_device = plan.rows_at(j)  # made with the sweep: nothing asked of the device here
        if len(idx) == batch:
            def forward(*args, **kwargs):
                plan.rows_now, plan.layer_now = idx, j
                return original(*args, **kwargs)
            return forward
        clean = outputs.get(j)
        first = clean[0] if isinstance(clean, tuple) else clean
        if not torch.is_tensor(first) or first.dim() < 2 or first.shape[0] != 1:  # (the clean forward's batch is 1)
            raise NotSweepable(f"layer {j}'s output is not [batch, ...] hidden states")
        if j not in arg_shapes:
            raise NotSweepable(f"layer {j} did not run in the clean forward")
        pos_shapes, kw_shapes = arg_shapes[j]
        rows = on_device.to(first.device)

        def merged(out, clean_out):  # the rows run, the clean output in the others (every tensor of a tuple)
            if torch.is_tensor(out):
                if torch.is_tensor(clean_out) and clean_out.dim() == out.dim() and clean_out.shape[0] == 1 \
                        and out.shape[0] == len(idx) and out.shape[1:] == clean_out.shape[1:]:
                    return clean_out.to(out.dtype).expand(batch, *clean_out.shape[1:]).index_copy(0, rows, out)
                raise NotSweepable(f"layer {j} returned a tensor of shape {tuple(out.shape)} without its batch first")
            if isinstance(out, tuple) and isinstance(clean_out, tuple) and len(out) == len(clean_out):
                return tuple(merged(o, c) for o, c in zip(out, clean_out))
            if out is None or not isinstance(out, (tuple, list, dict)):
                return out
            raise NotSweepable(f"layer {j} returned a {type(out).__name__}")

        def forward(*args, **kwargs):
            plan.rows_now, plan.layer_now = idx, j
            if len(args) != len(pos_shapes) or set(kwargs) - set(kw_shapes):
                raise NotSweepable(f"layer {j} is called with other arguments than in the clean forward")
            out = original(*_rows_of(args, pos_shapes, on_device, batch),
                           **{k: _rows_of(v, kw_shapes.get(k), on_device, batch) for k, v in kwargs.items()})
            return merged(out, clean)
        return forward

    with replayed_below(layers, lowest, outputs.get(lowest - 1), batch), \
            patched_forwards((layers[j], wrap(layers[j], j)) for j in range(lowest, len(layers))):
        yield


# sequence classifiers whose head reads only the first token's final hidden state, built of
# BERT-style layers (the self-attention's output module takes (attention output, residual))
FIRST_TOKEN_HEADS = frozenset({
    "BertForSequenceClassification", "RobertaForSequenceClassification", "ElectraForSequenceClassification",
    "XLMRobertaForSequenceClassification", "CamembertForSequenceClassification",
})


def first_token_output(model, layers: torch.nn.ModuleList) -> torch.nn.Module | None:
    """The last layer's attention-output module where only the first token's row matters
    downstream (see :func:`first_token_only`), else None."""
    if type(model).__name__ not in FIRST_TOKEN_HEADS or not len(layers):
        return None
    return getattr(getattr(layers[-1], "attention", None), "output", None)


@contextlib.contextmanager
def first_token_only(module: torch.nn.Module | None):
    """In the last layer of a classifier that reads only the first token, pass only that
    row on after the attention: the output projection, the feed-forward block and the
    layer's output are computed for one row instead of n. Exact: no other row of the last
    layer reaches the logits (their gradients are zero either way). ``module`` from
    :func:`first_token_output`; None does nothing."""
    if module is None:
        yield
        return
    original = type(module).forward

    def forward(hidden_states, input_tensor, *args, **kwargs):
        return original(module, hidden_states[:, :1], input_tensor[:, :1], *args, **kwargs)

    with patched_forwards([(module, forward)]):
        yield


@contextlib.contextmanager
def projections_once(layer: torch.nn.Module, plan: Attribute):
    """In the target layer, every row of the batch is the same until its attention has
    run, so the projections called before it (Q, K, V) compute one row and expand it;
    those called after (output projection, MLP) see the alpha-scaled rows as usual."""

    def wrap(module):
        original = type(module).forward

        def forward(x, *args, **kwargs):
            # [batch, tokens, features] only, batch the pass's rows: a router's [batch * tokens,
            # features] (JetMoE's attention experts) or Gemma 3n's [streams, batch, tokens,
            # features] has no batch axis first to take one row of
            rows = len(plan.local) if plan.local is not None else len(plan.alphas)
            if not plan.called and torch.is_tensor(x) and x.dim() == 3 and x.shape[0] == rows > 1:
                if plan.first is None:
                    one = original(module, x[:1], *args, **kwargs)
                    return one.expand(x.shape[0], *one.shape[1:])
                # several examples: one row each, then every row takes its example's
                each = original(module, x.index_select(0, plan.first.to(x.device)), *args, **kwargs)
                return each.index_select(0, plan.local.to(each.device))
            return original(module, x, *args, **kwargs)

        return forward

    projections = [m for m in layer.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]
    with patched_forwards((module, wrap(module)) for module in projections):
        yield


def not_routed(model_type: str, family: str, layer: int) -> ModelError:
    """The one line for a model whose attention went around both the attention interface and
    every adapter (an architecture attattr does not support yet)."""
    return ModelError(f"model type '{model_type}' computes its attention ({family} layer {layer}) outside transformers'"
                      " attention interface, and attattr has no adapter for it yet; see docs/models.md for the"
                      " supported architectures")
