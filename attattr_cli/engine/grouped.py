"""Several short examples in one pass: the integration nodes of a group of examples share
the forward and backward passes (encoder classifiers; docs/method.md 1.4, fact 7).

The group is right-padded to the longest example, the padding masked (a masked key gets
probability exactly 0); one clean forward and backward serve the group; per target layer, passes
hold the nodes of every example still refining; the maps, sums and estimates are then made per
example from its own rows, cropped to its length, as :class:`~attattr_cli.engine.scorer.Scorer`
makes them: the numbers of one example at a time up to float rounding (tests/test_grouped.py).
Decoders, encoder-decoder models and language-model targets are scored one example at a time.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..data.types import Example
from ..ops import reference
from . import attention, memory
from .batching import pad_rows
from .encoding import Encoded
from .layer_integral import Maps, integrate
from .results import ExampleScore
from .rows import crop_saved

MAX_TOKENS = 128  # longer examples are scored one at a time (their passes are full already)
DEFAULT_GROUP = 32  # examples per group when the options leave it to attattr (hidden size 384 or wider)
MAX_GROUP = 64  # narrower models get proportionally more (their passes hold more rows), up to this
WINDOW = 8  # groups are formed from this many groups' worth of examples, sorted by length
# a group ends before an example longer than PAD_RATIO x its shortest + PAD_SLACK tokens:
# padding is work (MiniLM on SST-2 in groups of 32 padded to the longest ran slower than
# one example at a time)
PAD_RATIO, PAD_SLACK = 1.25, 4


def groupable(scorer) -> bool:
    """Whether this scorer's model and options allow several examples per pass."""
    arch = scorer.arch
    return (not scorer.options.lm and not arch.is_decoder and not arch.is_encoder_decoder
            and [f.name for f in scorer.families] == ["self"] and scorer.pad_id is not None)


def group_size(scorer) -> int:
    """Examples per group: ``options.group``, else DEFAULT_GROUP (scaled up for models narrower
    than memory.CPU_REFERENCE_HIDDEN, at most MAX_GROUP) where the model allows it, else 1."""
    if not groupable(scorer):
        return 1
    if scorer.options.group is not None:
        return scorer.options.group
    narrow = memory.CPU_REFERENCE_HIDDEN / max(memory.hidden_size(scorer.model.config), 1)
    return int(min(MAX_GROUP, max(DEFAULT_GROUP, round(DEFAULT_GROUP * narrow))))


def plan_groups(examples: Sequence[Example], encoded: dict, size: int) -> list[list[Example]]:
    """Groups of at most ``size`` examples of similar length: windows of ``WINDOW * size``
    consecutive examples are sorted by length and cut into groups (a group ends where the
    padding would pass PAD_RATIO, PAD_SLACK); an example longer than MAX_TOKENS is a group
    of its own. Every example is in exactly one group."""
    if size <= 1:
        return [[e] for e in examples]
    out = []
    span = WINDOW * size
    for start in range(0, len(examples), span):
        window = sorted(examples[start:start + span], key=lambda e: len(encoded[e.index].input_ids))
        group: list[Example] = []
        for e in (e for e in window if len(encoded[e.index].input_ids) <= MAX_TOKENS):
            n = len(encoded[e.index].input_ids)
            if group and (len(group) == size or n > PAD_RATIO * len(encoded[group[0].index].input_ids) + PAD_SLACK):
                out.append(group)
                group = []
            group.append(e)
        if group:
            out.append(group)
        out.extend([e] for e in window if len(encoded[e.index].input_ids) > MAX_TOKENS)
    return out


def score_group(scorer, examples: Sequence[Example], encs: Sequence[Encoded],
                on_layer: Callable[[int, int], None] | None = None) -> list[ExampleScore]:
    """Score ``examples`` (encoded as ``encs``) together; one result per example, in order.
    ``on_layer(position in the group, layer)`` after each example's layer is done. A group
    of one example is scored by ``scorer.score``."""
    if len(examples) == 1:
        tick = None if on_layer is None else (lambda layer: on_layer(0, layer))
        return [scorer.score(examples[0], encs[0], on_layer=tick)]
    return _Group(scorer, examples, encs).score(on_layer)


class _Group:
    def __init__(self, scorer, examples: Sequence[Example], encs: Sequence[Encoded]):
        self.sc = scorer
        self.examples, self.encs = list(examples), list(encs)
        self.lengths = [len(e.input_ids) for e in encs]
        self.width = max(self.lengths)
        self.inputs = pad_rows([e.model_inputs() for e in encs], scorer.pad_id, scorer.device)
        self.acc = scorer.acc

    # -- the whole group ---------------------------------------------------------------
    def score(self, on_layer) -> list[ExampleScore]:
        sc, count = self.sc, len(self.examples)
        keeps = {sc.keep_for(e) for e in self.encs}
        keep = keeps.pop() if len(keeps) == 1 else "maps"  # short examples: every one keeps the same
        fam = sc.families[0]
        sites = [(fam.name, layer) for layer in sc.layers_of[fam.name]]
        with attention.taken_over(sc.model):
            clean, record, logits_g = sc.clean_forward(sites, keep, lambda: sc.model(**self.inputs).logits)
            logits = logits_g.detach()
            preds = [int(p) for p in logits.argmax(-1)]
            golds = [-1 if e.label is None else sc.label_map[e.label] for e in self.examples]
            targets = [sc.choose_target(p, g, e) for p, g, e in zip(preds, golds, self.examples)]
            self.targets = torch.tensor(targets, device=sc.device)
            f_full = sc.target_value(logits, self.targets)
            at_one = sc.at_one(sites, clean, record, lambda leaves: torch.autograd.grad(
                sc.target_value(logits_g, self.targets).sum(), leaves))
            del logits_g
            per_example: list[list[dict]] = [[] for _ in range(count)]
            for site in sites:
                gs, f0s, convs, saved = self.integrate(site, clean, at_one.get(site), f_full)
                fulls = f_full.tolist()
                items = [(gs[e:e + 1, :, :self.lengths[e]], f0s[e], fulls[e], saved[e], convs[e]) for e in range(count)]
                for e, result in enumerate(sc.layer_results(items, keep)):  # the examples' numbers in one copy
                    per_example[e].append(result)
                    if on_layer is not None:
                        on_layer(e, site[1])
                del gs
        out = []
        for e, (example, enc) in enumerate(zip(self.examples, self.encs)):
            n = self.lengths[e]
            probs = {s: p[e:e + 1, ..., :n, :n] for s, p in record.probs.items()}  # its clean attention, cut to n
            family = sc.family_score(fam, keep, record.keep, probs, per_example[e], n)
            out.append(sc.example_score(example, enc, logits[e:e + 1], preds[e], golds[e], targets[e],
                                         float(f_full[e]), {fam.name: family}))
        return out

    # -- passes ------------------------------------------------------------------------
    def _run(self, site, clean, owner: torch.Tensor, alphas: torch.Tensor, weights: torch.Tensor | None,
             saved: dict):
        """Passes over rows (example ``owner[r]`` at ``alphas[r]``, example-major), in chunks
        that fit memory (halved on an out-of-memory error): yields (row slice, w_r dF/dO_r or
        None without weights, F_r). Fills ``saved`` with each example's target-layer projections."""
        sc = self.sc

        def run(part):
            return self._pass(site, clean, owner[part], alphas[part], None if weights is None else weights[part], saved)

        size = sc.auto_step_batch(self.encs[0], site, len(owner), self.width)  # a padded row: the width's tokens
        for part, (g, f) in sc.back_off.chunks(len(owner), size, run, sc.warn):
            sc.last_step_batch = max(sc.last_step_batch, part.stop - part.start)
            yield part, g, f

    def _pass(self, site, clean, owner, alphas, weights, saved):
        sc = self.sc
        change = torch.ones(len(owner), dtype=torch.bool)
        change[1:] = owner[1:] != owner[:-1]
        first = torch.nonzero(change).flatten()
        local = torch.cumsum(change.long(), 0) - 1
        examples = owner[first].tolist()
        plan = attention.Attribute(site[1], alphas.to(sc.device), sc.backend, family=site[0],
                                   first=first.to(sc.device), local=local.to(sc.device), owner=owner.to(sc.device))
        rows = {k: v.index_select(0, plan.owner) for k, v in self.inputs.items()}
        with sc.sites.target_pass(site, clean, plan), torch.set_grad_enabled(weights is not None):
            logits = sc.model(**rows).logits
            f = sc.target_value(logits, self.targets.index_select(0, plan.owner))
            if plan.leaf is None:
                raise attention.not_routed(sc.arch.model_type, site[0], site[1])
            g = None
            if weights is not None:
                (g,) = torch.autograd.grad((f * weights.to(f)).sum(), plan.leaf)
                g = g.to(self.acc)
        for i, e in enumerate(examples):
            if e not in saved:
                one = {k: (v[i:i + 1] if torch.is_tensor(v) else v) for k, v in plan.saved.items()}
                saved[e] = crop_saved(one, self.lengths[e])
        return g, f.detach()

    # -- the integral ----------------------------------------------------------------
    def integrate(self, site, clean, grad_at_one, f_full):
        """G, F(0), (nodes, error estimate, cap hit[, state]) and saved projections per example
        (engine/layer_integral.py's ``integrate``); with ``--tol`` the examples refine in
        lock-step, those still refining sharing one pass per level."""
        saved: dict = {}
        padded: dict = {}  # A and V of every example, zero-padded to the group's width (made once)

        def stacked(_key):
            if not padded:
                padded["probs"], padded["v"] = self._padded_a_v(saved, self.acc)
            return padded

        g, f0, convs = integrate(self.sc, len(self.examples), lambda o, a, w: self._run(site, clean, o, a, w, saved),
                                 grad_at_one, f_full.detach().to("cpu", torch.float64).numpy(), self.acc,
                                 Maps(self.sc.judged, stacked, key=None), lambda e: (self.lengths[e], saved[e]))
        return g, f0, convs, saved

    def _padded_a_v(self, saved: dict, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Every example's clean attention A [E, head, W, W] and values V [E, head, W, d] of the
        target layer, zero beyond its length (A made in one call where no example masks
        anything within its own length, as for padding-only masks)."""
        count, width, sc = len(self.examples), self.width, self.sc
        first = saved[0]
        q, k, v = (first[key].new_zeros((count, *first[key].shape[1:2], width, first[key].shape[-1]))
                   for key in ("q", "k", "v"))
        for e in range(count):
            n = self.lengths[e]
            q[e, :, :n], k[e, :, :n], v[e, :, :n] = saved[e]["q"][0], saved[e]["k"][0], saved[e]["v"][0]
        real = torch.arange(width, device=q.device) < torch.tensor(self.lengths, device=q.device).view(-1, 1)  # [E, W]
        if first["causal"] or any(saved[e]["mask"] is not None for e in range(count)):
            a = q.new_zeros((count, q.shape[1], width, width), dtype=dtype)
            for e in range(count):
                n = self.lengths[e]
                a[e, :, :n, :n] = sc.layer_probs(saved[e], dtype)[0]
        else:
            blocked = torch.zeros(real.shape, dtype=q.dtype, device=q.device).masked_fill(~real, torch.finfo(q.dtype).min)
            a = reference.attention_probs(q, k, blocked[:, None, None, :], first["scale"], first["softcap"]).to(dtype)
            a = a * real[:, None, :, None]  # padded query rows: zero
        return a, v.to(dtype)

