"""A circuit task: counterfactual pairs on a causal language model, run with heads as nodes.
:class:`CircuitTask` encodes the pairs once in batches of equal token length (no padding
reaches a head) and runs the model under a :class:`~attattr_cli.engine.attention.HeadPatch`
plan: recording runs, runs with heads gated (kept, patched or interpolated), and each pair's
metric on the last position's logits. Shapes: a head output ``[batch, head, query, d]``
(before the output projection), gates ``[rows, layer, head]``, metrics ``[rows]``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ...data.pairs import Pair, encode_pair
from ...errors import DataError, OptionError
from ...engine import attention
from ...engine.metrics import pair_metric_rows
from ...engine.options import METRICS
from ...models.arch import last_logits_only, takes_logits_to_keep
from .ablations import ABLATIONS  # noqa: F401  (the registered ablations)

NODES = ("heads", "heads+mlp")  # MIB's node level: attention heads, or heads and each layer's MLP


@dataclass
class PairBatch:
    """Pairs of one token length: ``positions`` index the task's pairs."""

    positions: list[int]
    clean: torch.Tensor  # [b, n] token ids
    counterfactual: torch.Tensor  # [b, n]
    answer: torch.Tensor  # [b, a] ids, padded by repeating the first
    answer_in: torch.Tensor  # [b, a] True for the real entries, False for the padding
    foil: torch.Tensor
    foil_in: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.positions)

    def take(self, idx: torch.Tensor) -> "PairBatch":
        """The batch's rows ``idx`` (a pair may repeat: one row per node, head or mask)."""
        return PairBatch([self.positions[i] for i in idx.tolist()], self.clean[idx], self.counterfactual[idx],
                         self.answer[idx], self.answer_in[idx], self.foil[idx], self.foil_in[idx])


def _set(ids: Sequence[Sequence[int]]):
    """Token sets of different sizes as ([rows, width] ids padded with the first, [rows, width] real)."""
    width = max(len(x) for x in ids)
    idx = torch.tensor([list(x) + [x[0]] * (width - len(x)) for x in ids], dtype=torch.long)
    real = torch.tensor([[True] * len(x) + [False] * (width - len(x)) for x in ids])
    return idx, real


def rows_of(tensors: dict, idx) -> dict:
    """Each tensor's rows ``idx`` (a tensor of one row serves every row as it is)."""
    return {k: (v if v.shape[0] == 1 else v[idx]) for k, v in tensors.items()}


class CircuitTask:
    """Pairs encoded for one loaded causal LM (``models.loading.LoadedModel`` with ``lm``)."""

    def __init__(self, loaded, pairs: Sequence[Pair], metric: str = "logit-diff", batch_size: int = 32,
                 mlp: bool = False):
        if not getattr(loaded, "lm", False):
            raise OptionError("circuits need a causal language model: load it with lm=True (--lm)")
        if metric not in METRICS:
            raise OptionError(f"unknown metric {metric!r}; available: {', '.join(METRICS)}")
        if not pairs:
            raise DataError("no pairs to evaluate")
        self.loaded = loaded
        self.model = loaded.model
        self.pairs = list(pairs)
        self.metric_name = metric
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        limit = getattr(loaded.arch, "max_length", None)
        enc = [encode_pair(loaded.tokenizer, p, limit) for p in self.pairs]
        by_len: dict[int, list[int]] = {}
        for i, e in enumerate(enc):
            by_len.setdefault(len(e.clean), []).append(i)
        self.batches: list[PairBatch] = []
        for n in sorted(by_len):
            idx = by_len[n]
            for s in range(0, len(idx), batch_size):
                part = idx[s:s + batch_size]
                a, aw = _set([enc[i].answer for i in part])
                f, fw = _set([enc[i].foil for i in part])
                t = lambda rows: torch.tensor(rows, dtype=torch.long, device=self.device)  # noqa: E731
                self.batches.append(PairBatch(part, t([enc[i].clean for i in part]),
                                              t([enc[i].counterfactual for i in part]),
                                              a.to(self.device), aw.to(self.device),
                                              f.to(self.device), fw.to(self.device)))
        self.n = len(self.pairs)
        self.layers = int(loaded.arch.num_layers)
        self.heads = int(loaded.arch.num_heads)
        # nodes per layer: the heads, and with ``mlp`` the layer's MLP as one more node (column
        # ``heads`` of every [layer, node] array; MIB's node level with MLPs)
        self.mlps = mlp_modules(self.model) if mlp else None
        self.width = self.heads + (1 if mlp else 0)
        self.last_only = takes_logits_to_keep(self.model)  # checked once, not per pass

    # ------------------------------------------------------------------ running

    def over(self):
        """The model's attention routed through attattr (a no-op where it already is)."""
        return contextlib.nullcontext() if attention.is_taken_over() else attention.taken_over(self.model)

    def logits(self, ids: torch.Tensor | None, plan=None, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Last-position logits [rows, vocab] under ``plan`` (the model already taken over)."""
        kw = {"input_ids": ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        if self.last_only:  # the metric reads the last position: only it goes through the LM head
            kw.update(last_logits_only((ids if inputs_embeds is None else inputs_embeds).shape[1], self.device))
        with attention.active(plan), self._mlp_nodes(plan):
            out = self.model(**kw, use_cache=False)
        return out.logits[:, -1].double()

    @contextlib.contextmanager
    def _mlp_nodes(self, plan):
        """With MLP nodes, each layer's MLP output under ``plan`` (a HeadPatch) as a head's: kept
        in ``record`` and given a zero leaf in ``leaves`` under ``("mlp", layer)`` (as [batch, 1,
        query, hidden]), and gated by column ``heads`` of the gate towards ``source``."""
        if self.mlps is None or not isinstance(plan, attention.HeadPatch):
            yield
            return
        H = self.heads

        def hook(_module, _args, out, layer):
            if not torch.is_tensor(out):
                raise OptionError("this model's MLP returns more than its output (a mixture of experts, say): "
                                  "use --nodes heads")
            gate_of = lambda g: g[layer, H].view(1, 1, 1, 1) if g.dim() == 2 else g[:, layer, H].view(-1, 1, 1, 1)  # noqa: E731
            y = attention.patch_node(plan, ("mlp", layer), out.unsqueeze(1), gate_of)
            return y.squeeze(1)

        handles = [m.register_forward_hook(lambda mod, a, o, l=l: hook(mod, a, o, l)) for l, m in enumerate(self.mlps)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def metric(self, logits: torch.Tensor, batch: PairBatch) -> torch.Tensor:
        """The metric of each row (engine/metrics.py: one definition for scoring and circuits)."""
        return pair_metric_rows(logits, batch.answer, batch.answer_in, batch.foil, batch.foil_in, self.metric_name)

    def record(self, ids: torch.Tensor, want_probs: bool = False, grad: bool = False):
        """(logits, {layer: head output [b, head, n, d]}, {layer: probs}) of a plain run."""
        plan = attention.HeadPatch(record={}, want_probs=want_probs)
        with self.over(), torch.set_grad_enabled(grad):
            logits = self.logits(ids, plan)
        outs = plan.record if grad else {k: v.detach() for k, v in plan.record.items()}
        return logits, outs, plan.probs

    def parts(self, batch: PairBatch) -> dict:
        """Head outputs with one part of the counterfactual run's head swapped in:
        ``{"pattern": {layer: A' V}, "values": {layer: A V'}}`` (A, V the clean run's pattern and
        values, A', V' the counterfactual's): what patching only where a head looks, or only
        what it reads, puts in its place."""
        runs = []
        for ids in (batch.clean, batch.counterfactual):
            plan = attention.HeadPatch(want_probs=True, values={})
            with self.over(), torch.no_grad():
                self.logits(ids, plan)
            runs.append((plan.probs, plan.values))
        (a, v), (a2, v2) = runs
        return {"pattern": {l: a2[l] @ v[l] for l in a}, "values": {l: a[l] @ v2[l] for l in a}}

    def layer_outputs(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(last-position logits, {layer: what the decoder layer returned}) of a plain run without
        gradients, for :meth:`from_layer` (the layers below a target replayed instead of recomputed)."""
        from ...models.arch import find_layers

        _, layers = find_layers(self.model)
        seen: dict = {}
        det = lambda o: o.detach() if torch.is_tensor(o) else tuple(det(x) for x in o) if isinstance(o, tuple) else o  # noqa: E731
        hooks = [layer.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, det(o)))
                 for i, layer in enumerate(layers)]
        try:
            with self.over(), torch.no_grad():
                logits = self.logits(ids)
        finally:
            for h in hooks:
                h.remove()
        return logits, seen

    def from_layer(self, layer: int, outputs: dict, ids: torch.Tensor, owner: torch.Tensor, plan) -> torch.Tensor:
        """Last-position logits of rows that differ from their clean run only from ``layer`` up:
        the layers below return the clean run's output (``outputs`` of :meth:`layer_outputs`,
        row r taking pair ``owner[r]``'s)."""
        from ...models.arch import find_layers

        _, layers = find_layers(self.model)
        with attention.replayed_below(layers, layer, outputs.get(layer - 1), len(owner), owner):
            return self.logits(ids[owner], plan)

    def mean_outputs(self) -> dict:
        """Each head's output averaged over the clean prompts, per position from the end
        (prompts of several lengths are aligned at their last token): MIB's mean ablation."""
        width = max(b.clean.shape[1] for b in self.batches)
        sums: dict = {}
        counts = torch.zeros(width)
        for b in self.batches:
            _, outs, _ = self.record(b.clean)
            n = b.clean.shape[1]
            counts[width - n:] += b.size
            for k, v in outs.items():
                sums.setdefault(k, v.new_zeros(1, v.shape[1], width, v.shape[3]))[:, :, width - n:] += v.sum(0, keepdim=True)
        return {k: s / counts.clamp(min=1).view(1, 1, -1, 1).to(s) for k, s in sums.items()}

    def gated(self, batch: PairBatch, source: dict | None, gate: torch.Tensor) -> torch.Tensor:
        """Metric [rows] with heads gated by ``gate`` [rows, layer, head] towards ``source`` (None:
        zero); rows go mask-major: row r is pair ``r % batch.size`` of the batch."""
        owner = torch.arange(gate.shape[0], device=self.device) % batch.size
        plan = attention.HeadPatch(source=None if source is None else rows_of(source, owner), gate=gate)
        return self.metric(self.logits(batch.clean[owner], plan), batch.take(owner))


MLP_NAMES = ("mlp", "feed_forward", "ffn")  # a decoder layer's MLP, by the names transformers gives it


def mlp_modules(model) -> list:
    """Each decoder layer's MLP module (MLP nodes); OptionError where a layer has none by a
    known name."""
    from ...models.arch import find_layers

    _, layers = find_layers(model)
    found = []
    for i, layer in enumerate(layers):
        module = next((getattr(layer, n) for n in MLP_NAMES if isinstance(getattr(layer, n, None), torch.nn.Module)),
                      None)
        if module is None:
            raise OptionError(f"layer {i} of this model has no MLP module named {', '.join(MLP_NAMES)}: "
                              "use --nodes heads")
        found.append(module)
    return found


Progress = Callable[[int, int, str], None]


@dataclass
class Context:
    """What every head method gets: the task, the ablation, the settings; the ablation's
    sources are computed once per batch and shared by every method."""

    task: CircuitTask
    ablation: str = "patching"
    steps: int | None = None  # integration nodes of the path methods (None: each method's own default)
    seed: int = 0
    progress: Progress | None = None
    verify: int | None = None  # heads of largest |AtP| verified by exact patching (None: each method's default)
    cache: dict = field(default_factory=dict)  # what several methods share (one integral, two reductions)
    _sources: dict = field(default_factory=dict)
    _shared: dict = field(default_factory=dict)  # what the ablation keeps for every batch (the means)

    def part_source(self, batch: PairBatch, part: str) -> dict:
        """The sources of patching one part of each head (``pattern`` or ``values``; only where
        the ablation is the counterfactual run)."""
        if self.ablation != "patching":
            raise OptionError(f"patching only a head's {part} needs --ablation patching (a counterfactual run), "
                              f"not {self.ablation}")
        key = ("parts", id(batch))
        if key not in self._sources:
            self._sources[key] = self.task.parts(batch)
        return self._sources[key][part]

    def source(self, batch: PairBatch) -> dict:
        key = id(batch)
        if key not in self._sources:
            if self.ablation not in ABLATIONS:
                raise ABLATIONS.unknown(self.ablation)
            self._sources[key] = ABLATIONS[self.ablation].source(self.task, batch, self._shared)
        return self._sources[key]

    def choose(self, rankings: list, ks) -> int:
        """The index of the ranking whose curve (CMD's ranking by |score|) is nearest 1 at the
        curve's points ``ks``, on this context's pairs only (a method that chooses among
        candidates asks its task; with a split it never sees the pairs it is judged on). Each
        point is weighted by the width CMD's trapezoids give it; each distinct set is run once
        (one forward per pair and set). Ties: the first."""
        import numpy as np

        from ..ablation import PERCENTAGES, curve, keep_masks

        if not set(ks) <= set(PERCENTAGES):
            raise ValueError(f"{ks} are not all points of the curve {PERCENTAGES}")
        masks = np.concatenate([keep_masks(r, True, ks) for r in rankings])
        unique, which = np.unique(masks.reshape(len(masks), -1), axis=0, return_inverse=True)
        f = curve(self, unique.reshape(-1, *masks.shape[1:]))[1][which.ravel()]
        at = [PERCENTAGES.index(k) for k in ks]
        width = np.array([(PERCENTAGES[min(i + 1, len(PERCENTAGES) - 1)] - PERCENTAGES[max(i - 1, 0)]) / 2 for i in at])
        return int(np.argmin((np.abs(1 - f.reshape(len(rankings), len(ks))) * width).sum(1)))

    def tick(self, done: int, what: str) -> None:
        if self.progress is not None:
            self.progress(done, len(self.task.batches), what)
