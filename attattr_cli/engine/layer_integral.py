"""The integral, once for every way its passes run (docs/method.md section 1.2,
docs/integration.md): G = sum_k w_k dF/dO(alpha_k) of ``count`` integrals at once (one layer
of an example, the examples of a group, the steps of a generation, the layers of a sweep), by
the fixed rule with its embedded estimate (:func:`fixed`) or to ``--tol`` (:func:`to_tol`).
The strategies differ only in how their rows run, ``run(owner, alphas, weights)``: it yields
(rows, w_r dF/dO_r or None without weights, F_r) over the rows of integral ``owner[r]`` at
``alphas[r]``, in passes that fit memory (the rows a slice, or their indices); and in which
clean attention and values each integral's maps are made with (:class:`Maps`).

:class:`Integration` is the Scorer's part of it (one target site per integral, the passes of
one example); the map measures the estimates read are at the end."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from ..ops import reference, reference_mask, with_causal
from . import adaptive, attention, memory
from .encoding import Encoded
from .options import DEFAULT_TOL
from .rows import add_rows, to_device


class Integration:
    """The Scorer's integration (a mixin: it uses the scorer's model, options, sites and
    backend)."""

    # the passes of every target layer of an example in one sweep per round (engine/sweep.py);
    # False: one pass per target layer (benches compare the two; the numbers agree)
    sweep = True
    sweeps_work = True  # False once a model's layers did not run as a sweep (engine/sweep.py)

    # -- step micro-batching ------------------------------------------------------
    def auto_step_batch(self, enc: Encoded, site, steps: int | None = None, width: int | None = None) -> int:
        """Steps per pass (at most ``steps``, default all) that fit the free memory of the
        device: an estimate of the activations kept for the backward through the layers
        at and above the target (``width``: the tokens of a row, default ``enc``'s).
        ``--step-batch`` overrides it."""
        if self.options.step_batch is not None:
            return self.options.step_batch
        steps = len(self.alphas) if steps is None else steps
        n = width or max(len(enc.input_ids), len(enc.decoder_input_ids or []))
        kept = len(enc.lm_positions) if enc.lm_positions is not None else 1
        per_step = memory.step_bytes(self.model.config, self.arch, site, n, self.dtype, self.device, kept,
                                     self.options.lm)
        return memory.steps_that_fit(per_step, steps, n, self.device, memory.hidden_size(self.model.config))

    def integrate(self, enc: Encoded, site, target, clean, grad_at_one: torch.Tensor | None = None,
                  f_full: float | None = None, floor: float = 0.0):
        """One target site's integral: (G = sum_k w_k dF/dO_k [1, ...], F with its attention at
        0, the saved projections, (nodes, error estimate, cap hit[, state])). ``grad_at_one``:
        dF/dO at alpha = 1 from the clean forward's backward (F there: ``f_full``), not
        recomputed. ``floor``: the least scale ``--tol`` judges the layer against (the example's
        largest kept number so far; engine/adaptive.py)."""
        box: dict = {}

        def run(owner, alphas, weights):
            for part, g, f, box["saved"] in self.passes(enc, site, one_target(target), clean, alphas, weights):
                yield part, g, f

        def zero():  # F(0): one forward at batch 1, no backward
            alpha = torch.zeros(1, dtype=torch.float64)
            ((_part, _g, f, saved),) = self.passes(enc, site, one_target(target), clean, alpha, None)
            box.setdefault("saved", saved)
            return [float(f[0])]

        maps = Maps(self.judged, lambda _k: box["saved"], alone=True)
        g, f0, convs = integrate(self, 1, run, grad_at_one, [f_full], self.acc, maps, lambda _i: (None, box["saved"]),
                                 [floor], zero, summed=True)
        return g, f0[0], box["saved"], convs[0]

    @property
    def acc(self) -> torch.dtype:
        """The dtype gradients are added up in."""
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    def passes(self, enc: Encoded, site, targets, clean, alphas: torch.Tensor, weights: torch.Tensor | None):
        """The rows of ``site``'s passes (row r at ``alphas[r]``), in micro-batches that fit
        memory (halved on an out-of-memory error): yields (row slice, w_r dF/dO_r, or None
        without ``weights``, F_r, saved projections). ``targets(part)`` -> (the target of the
        rows ``part``, a context to run their pass in)."""
        on_device = to_device(alphas, self.device)  # before the passes: none copies from the host (issue 53)

        def run(part):
            target, context = targets(part)
            with context:
                return self._step_chunk(enc, site, target, clean, on_device[part],
                                        None if weights is None else weights[part])

        size = self.auto_step_batch(enc, site, len(alphas))
        for part, (g, f, saved) in self.back_off.chunks(len(alphas), size, run, self.warn):
            if weights is not None:  # (a forward alone is no integration step)
                self.last_step_batch = max(self.last_step_batch, part.stop - part.start)
            yield part, g, f, saved

    def fixed_nodes(self, grad_at_one: torch.Tensor | None, acc_dtype: torch.dtype):
        """The fixed rule's nodes left to evaluate, (alphas, weights, ratio, G, G_low): where the
        clean backward gave the alpha = 1 node (``grad_at_one``, [E, ...]) it is folded into G
        (and into the embedded lower-order rule's G_low; both None otherwise) and left out of
        the nodes. ``ratio`` = w_low / w of the nodes left (the embedded rule's G is
        sum_k ratio_k w_k dF/dO_k); None without an embedded rule."""
        alphas, weights = self.alphas, self.weights
        ratio = None if self.low is None else torch.from_numpy(self.low[0]) / weights
        g = g_low = None
        if grad_at_one is not None:
            one = alphas == 1
            g = grad_at_one.to(acc_dtype) * weights[one].sum().item()
            if ratio is not None:
                g_low = g * ratio[one].sum().item()
                ratio = ratio[~one]
            alphas, weights = alphas[~one], weights[~one]
        return alphas, weights, ratio, g, g_low

    def embedded_measures(self, items: list) -> list:
        """max |Attr(G - G_low)| and max |Attr(G)| ([2], on the device) of each ``(G, G_low,
        saved)``'s fixed-rule embedded estimate (:func:`embedded_errors`), all made in one batch
        (:meth:`measures`); None where G_low is None (no embedded rule)."""
        pairs = [(g2, saved) for g, g_low, saved in items if g_low is not None for g2 in (g - g_low, g)]
        rows = self.measures(pairs) if pairs else None
        for j in range(1, len(pairs), 2):  # max |Attr(G)| is also the residual's scale (Assembly.layer_results)
            g, saved = pairs[j]
            saved["measured"] = (g, g._version, rows[j])
        made = iter(rows[:, 0].reshape(-1, 2) if pairs else [])
        return [None if g_low is None else next(made) for _g, g_low, _s in items]

    @property
    def check_tol(self) -> float:
        """The tolerance convergence is judged at: --tol, or for a fixed rule the default's."""
        return self.options.tol if self.options.tol is not None else DEFAULT_TOL

    def measure(self, g: torch.Tensor, s: dict) -> torch.Tensor:
        """(max |Attr|, sum |Attr|, sum Attr) of the map made from ``g`` with the saved
        projections ``s`` ([3], on ``g``'s device; the map itself is not kept)."""
        return self.measures([(g, s)])[0]

    def measures(self, pairs: list) -> torch.Tensor:
        """:meth:`measure` of each ``(g, saved)``: [len, 3] on the device. The maps of layers
        whose shapes and masks agree are made in one batch (their attention too,
        :meth:`layers_probs`), a chunk of about SPREAD_CHUNK map entries at a time
        (:func:`layer_batches`): an example's layers cost a few launches, not a dozen each
        (issue 53)."""
        out: list = [None] * len(pairs)
        for i, (g, s) in enumerate(pairs):  # measured already (:meth:`embedded_measures`), G unchanged since
            seen = s.get("measured")
            if seen is not None and seen[0].data_ptr() == g.data_ptr() and seen[0].shape == g.shape \
                    and seen[0].stride() == g.stride() and seen[1] == g._version:
                out[i] = seen[2]
        todo = [i for i in range(len(pairs)) if out[i] is None]
        keys = [self.batch_key(pairs[i][1], pairs[i][0].dtype) + (tuple(pairs[i][0].shape[-3:]),) for i in todo]
        for batch in layer_batches(keys, [pairs[i][1] for i in todo]):
            part = [todo[j] for j in batch]
            dtype = pairs[part[0]][0].dtype
            self.layers_probs([pairs[i][1] for i in part], dtype)
            parts = [(pairs[i][0].reshape(1, *pairs[i][0].shape[-3:]), pairs[i][1]) for i in part]
            a, v, g = (torch.cat(x) if len(x) > 1 else x[0] for x in zip(
                *[(s["probs"], s["v"].to(dtype), g) for g, s in parts]))
            made = map_measures(a, v, g, self.judged)
            for j, i in enumerate(part):
                out[i] = made[j]
        return torch.stack(out)

    @staticmethod
    def batch_key(saved: dict, dtype: torch.dtype) -> tuple:
        """What layers must share for their attention and maps to be made in one batch."""
        mask = saved["mask"]
        return (tuple(saved["q"].shape), tuple(saved["k"].shape), dtype, None if mask is None else id(mask),
                saved["scale"], saved["softcap"], bool(saved["causal"]))

    @staticmethod
    def layers_probs(saved: list, dtype: torch.dtype) -> None:
        """:meth:`layer_probs` of each saved projections not yet holding them, those of layers
        that share a :meth:`batch_key` made in one batch (each keeps its slice)."""
        groups: dict = {}
        seen: set = set()
        for s in saved:
            if "probs" not in s and id(s) not in seen:
                seen.add(id(s))
                groups.setdefault(Integration.batch_key(s, dtype), []).append(s)
        for group in groups.values():
            if len(group) == 1:
                Integration.layer_probs(group[0], dtype)
                continue
            first = group[0]
            q, k = torch.cat([s["q"] for s in group]), torch.cat([s["k"] for s in group])
            mask = reference_mask(first["mask"])
            mask = with_causal(mask, q, k) if first["causal"] else mask
            probs = reference.attention_probs(q, k, mask, first["scale"], first["softcap"]).to(dtype)
            per = len(first["q"])
            for j, s in enumerate(group):
                s["probs"] = probs[j * per:(j + 1) * per]

    @property
    def judged(self) -> tuple:
        """The map's dimensions summed away before the tolerance is judged: what ``--keep``
        keeps (:func:`judged_dims`)."""
        return judged_dims(self.options.keep)

    @staticmethod
    def layer_probs(saved: dict, dtype: torch.dtype) -> torch.Tensor:
        """The target layer's attention A (in ``dtype``) from its saved projections, made once
        per layer and kept in ``saved`` (error estimates ask for it at every level)."""
        if "probs" not in saved:
            mask = reference_mask(saved["mask"])
            mask = with_causal(mask, saved["q"], saved["k"]) if saved["causal"] else mask
            saved["probs"] = reference.attention_probs(saved["q"], saved["k"], mask, saved["scale"],
                                                       saved["softcap"]).to(dtype)
        return saved["probs"]

    def _step_chunk(self, enc: Encoded, site, target, clean, a: torch.Tensor, w: torch.Tensor | None):
        """One micro-batch of steps: (w_k dF/dO_k per step, or None without ``w``, F at its
        alphas, saved Q/K/V). With ``ATTATTR_CUDA_GRAPHS=1`` and a clean forward bound to the
        static slots the pass goes through ops/graphs.py's CapturedPass (:meth:`captured_passes`;
        eager elsewhere, with the same numbers): off by default, not yet validated on a GPU."""
        family, layer = site

        def one_pass(a: torch.Tensor, w: torch.Tensor | None = None):
            plan = attention.Attribute(layer, a.to(self.device), self.backend, family=family)
            with self.sites.target_pass(site, clean, plan), torch.set_grad_enabled(w is not None):
                logits = self.logits(enc, len(a), self.sites.extra_inputs(site, clean, len(a)))
                f = self.target_value(logits, target)
                if w is None:
                    return (f.detach(),), plan.saved
                if plan.leaf is None:
                    raise attention.not_routed(self.arch.model_type, family, layer)
                (g,) = torch.autograd.grad((f * w).sum(), plan.leaf)
            return (g.to(w.dtype), f.detach()), plan.saved

        from ..ops import graphs  # (not at import: the dispatch-mode machinery stays unloaded)

        if graphs.enabled() and getattr(clean, "static", False):
            key = (self.pass_key(enc), site, repr(target), w is None)
            out, saved = self.captured_passes().run(key, one_pass, *((a,) if w is None else (a, w)))
            saved = graphs.owned(saved)
        else:
            out, saved = one_pass(a, w)
        return (None if w is None else out[0]), out[-1], saved

    def captured_passes(self):
        """The scorer's CapturedPass: the passes over a clean forward bound to the static slots
        (:meth:`bind_static`; a generation's are not, and run eagerly), keyed by shapes
        (:meth:`pass_key`), replayed for every later example of those shapes."""
        from ..ops import graphs

        shared = self.__dict__.get("_graphs")
        if shared is None:
            shared = self.__dict__["_graphs"] = graphs.CapturedPass(aux=True)
        return shared

    def graph_notes(self) -> list[str]:
        """With ``ATTATTR_CUDA_GRAPHS`` on: one line of what the scorer's graphs did (captures,
        replays, passes run eagerly and why), for the run's notes; else none."""
        from ..ops import graphs

        shared = self.__dict__.get("_graphs")
        if not graphs.enabled() or shared is None:
            return []
        st = shared.stats()
        why = f" ({'; '.join(st['fallbacks'])})" if st["fallbacks"] else ""
        kind = "emulated graphs" if shared.emulate else "CUDA graphs"
        return [f"{kind}: {st['captures']} passes captured, {st['replays'] - st['captures']} replayed for a later"
                f" example of their length, {st['eager_calls']} run eagerly{why}"]

    @staticmethod
    def pass_key(enc: Encoded) -> tuple:
        """What a captured pass depends on besides its inputs, the target and the static slots'
        contents: the example's shapes and its kept positions."""
        return ("shapes", len(enc.input_ids), len(enc.decoder_input_ids or ()), enc.token_type_ids is not None,
                None if enc.lm_positions is None else tuple(enc.lm_positions))

    def static_slots(self):
        """The scorer's static slots (ops/graphs.py's StaticSlots), made once."""
        from ..ops import graphs

        slots = self.__dict__.get("_slots")
        if slots is None:
            slots = self.__dict__["_slots"] = graphs.StaticSlots()
        return slots

    def bind_inputs(self, enc: Encoded) -> None:
        """The example's token ids (and kept positions) copied into the scorer's static slots,
        which its clean forward and passes then read (:meth:`_example_tensor`); once per example."""
        bound = self.__dict__.get("_bound")
        if bound is not None and bound[0] is enc:
            return
        slots, bound = self.static_slots(), {}
        for role in ("input_ids", "decoder_input_ids", "token_type_ids"):
            values = getattr(enc, role, None)
            if values is not None:
                bound[role] = slots.bind(role, self.on_device([values]))
        if enc.lm_positions is not None:
            bound["positions"] = slots.bind("positions", self.on_device(enc.lm_positions))
        self.__dict__["_bound"] = (enc, bound)

    def graphed_clean(self, enc: Encoded, sites: list, keep: str, ahead: tuple | None):
        """With ``ATTATTR_CUDA_GRAPHS`` on: the clean forward and its backward at alpha = 1 as one
        captured pass over the static slots, keyed by shapes like the integration passes, the
        target computed on the device (``ahead``: Scorer._target_ahead; the prediction's argmax
        or the given ids): (clean, record, logits, site -> dF/dO at alpha = 1), the numbers of
        the eager clean forward bit for bit. None (the eager clean forward runs): graphs off, or
        a target the host must choose from the logits (``ahead`` None)."""
        from ..ops import graphs

        if ahead is None or not graphs.enabled():
            return None
        mode, given = ahead
        self.bind_inputs(enc)
        lm = self.options.lm

        def clean_pass(given_t: torch.Tensor):
            clean, record, logits_g = self.clean_forward(sites, keep, lambda: self.logits(enc, 1))
            logits = logits_g.detach()
            if mode == "predicted":
                target = logits[0, :1].argmax(-1) if lm else logits[0].argmax()
            else:
                target = given_t if lm else given_t[0]
            at_one = self.at_one(sites, clean, record, lambda leaves: torch.autograd.grad(
                self.target_value(logits_g, target).sum(), leaves))
            return (logits, *at_one.values()), (clean, record, list(at_one), attention.packed_answers())

        captured = self.captured_passes()
        replays = captured.replays
        key = ("clean", self.pass_key(enc), tuple(sites), keep, mode, len(given or ()))
        with attention.checked_on_host(self.model, enc.input_ids):
            out, (clean, record, wanted, packed) = captured.run(key, clean_pass, self.on_device(given or [0]))
        attention.learn_packed(packed)
        self.last_step_batch = 0  # (clean_forward's, which a replay does not run)
        if captured.replays > replays:  # the graph's own: new objects, the attention copied out
            clean = dataclasses.replace(clean, outputs={p: dict(per) for p, per in clean.outputs.items()})
            record = attention.Record(keep=record.keep, probs=graphs.owned(record.probs))
        return clean, record, out[0], dict(zip(wanted, out[1:]))

    def bind_static(self, enc: Encoded, clean):
        """With ``ATTATTR_CUDA_GRAPHS`` on: the example's token ids (:meth:`bind_inputs`) and the
        clean forward's layer outputs copied into the scorer's static slots (ops/graphs.py's
        StaticSlots), which the passes then read, so that one graph per shape serves every
        example (one copy each per example, before its passes). ``clean`` is marked ``static``;
        off, nothing happens."""
        from ..ops import graphs

        if not graphs.enabled():
            return clean
        self.bind_inputs(enc)
        slots = self.static_slots()
        clean.outputs = {path: {i: slots.bind_tree(("clean", path, i), o) for i, o in per.items()}
                         for path, per in clean.outputs.items()}
        if clean.encoder_out is not None:
            clean.encoder_out = slots.bind("encoder_out", clean.encoder_out)
        clean.static = True
        return clean

    def attribute(self, g: torch.Tensor, s: dict, want_maps: bool = True) -> dict:
        """The maps (``want_maps``), head sums and head maxima from ``g`` and the saved projections ``s``."""
        self._note_kernel(s)
        return self.backend.attribution_from_grad(
            s["q"], s["k"], s["v"], g, mask=s["mask"], scale=s["scale"], softcap=s["softcap"],
            causal=s["causal"], want_maps=want_maps,
        )

    def key_sums(self, g: torch.Tensor, s: dict) -> dict:
        """The per-key sums (over heads and query rows, and over the rows from ``read_from``), the
        completeness total and the head maxima, with no ``n x n`` array (ops ``attribution_key_sums``)."""
        self._note_kernel(s)
        return self.backend.attribution_key_sums(s["q"], s["k"], s["v"], g, mask=s["mask"], scale=s["scale"],
                                                 softcap=s["softcap"], causal=s["causal"], read_from=self.read_from)

    def _note_kernel(self, s: dict) -> None:
        """Which kernel the attribution of these inputs runs on (the report's ``kernel``)."""
        self.last_kernel = self.backend.name if self.backend.supports(s["q"], s["mask"], s["softcap"]) else "torch"


# -- the integral, for every strategy ------------------------------------------------------
def one_target(target):
    """``targets(part, ...)`` for rows that all share ``target`` (no context to run them in)."""
    return lambda part, *_: (target, contextlib.nullcontext())


def rows_of(run, owner, alphas, weights):
    """Every row of ``run`` at once: (w_r dF/dO_r, F_r) in row order."""
    parts = list(run(owner, alphas, weights))
    if all(isinstance(p[0], slice) for p in parts):  # in order
        return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
    g = parts[0][1].new_empty((len(owner), *parts[0][1].shape[1:]))
    f = parts[0][2].new_empty(len(owner))
    for rows, g_part, f_part in parts:
        g[rows.to(g.device)], f[rows.to(f.device)] = g_part, f_part
    return g, f


class Maps:
    """The three measures the error control reads (engine/adaptive.py's Refinement) of maps
    Attr = A * (G V^T), with each integral's clean A and V from ``saved_of(key)``, the saved
    projections of the integrals whose ``key(rows)`` is ``key`` (default: one for all), made
    again where they change; ``key`` None: ``saved_of(None)`` holds one A ("probs") and V per
    integral (a group's padded examples). ``alone``: each G's measures made by itself (one
    layer's integral, as it always was: a batch's products may round otherwise)."""

    def __init__(self, judged: tuple, saved_of, key=lambda rows: torch.zeros_like(rows), alone: bool = False):
        self.judged, self.saved_of, self.key, self.alone, self.made = judged, saved_of, key, alone, {}

    def stack(self, k, dtype, with_av: bool = False):
        """[A, V, A V (with_av, else None where not yet made)] of stack ``k``."""
        saved = self.saved_of(k)
        made = self.made.get(k)
        if made is None or made[0] is not saved:
            made = self.made[k] = [saved, Integration.layer_probs(saved, dtype), saved["v"].to(dtype), None]
        if with_av and made[3] is None:
            made[3] = torch.matmul(made[1], made[2])
        return made[1:]

    def _parts(self, g, rows, with_av: bool = False):
        """(A, V, A V, the rows' g, where they go) per stack the rows use."""
        g = g.reshape(len(g), *g.shape[-3:])
        if self.key is None:
            a, v, av = self.stack(None, g.dtype, with_av)
            return [(a[rows], v[rows], None if av is None else av[rows], g, slice(None))]
        keys, out = self.key(rows), []
        for k in torch.unique(keys).tolist():
            sel = torch.nonzero(keys == k).flatten()
            out.append((*self.stack(k, g.dtype, with_av), g if len(sel) == len(rows) else g[sel.to(g.device)], sel))
        return out

    def measure(self, g, rows):
        """(max |Attr|, sum |Attr|, sum Attr) per row."""
        if self.alone and len(rows) > 1:
            return torch.cat([self.measure(g[i:i + 1], rows[i:i + 1]) for i in range(len(rows))])
        out = torch.empty((len(rows), 3), dtype=torch.float64)
        for a, v, _, part, sel in self._parts(g, rows):
            out[sel] = map_measures(a, v, part, self.judged).cpu()
        return out

    def derivative(self, g, rows):
        """sum Attr = <G, A V> per row (dF/dalpha at a node)."""
        out = torch.empty(len(rows), dtype=torch.float64)
        for _, _, av, part, sel in self._parts(g, rows, with_av=True):
            out[sel] = (part * av).sum(dim=(-3, -2, -1), dtype=torch.float64).cpu()
        return out

    def spread(self, g, rows):
        """One integral's leaves: max over the entries of sum |Attr|."""
        r = int(rows[0])
        a, v, _ = self.stack(None if self.key is None else int(self.key(rows[:1])[0]), g.dtype)
        a, v = (a[r], v[r]) if self.key is None else (a, v)
        return map_spread(a, v, g.reshape(len(g), *g.shape[-3:]), self.judged).cpu()


def layer_batches(keys: list, saved: list):
    """The indices of layers that can be made in one batch: grouped by ``keys`` (None: alone),
    each group in chunks of about SPREAD_CHUNK map entries (those of one layer's attention from
    its ``saved`` projections)."""
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(("alone", i) if key is None else key, []).append(i)
    for idx in groups.values():
        first = saved[idx[0]]
        step = max(1, SPREAD_CHUNK // max(first["q"][..., 0].numel() * first["k"].shape[-2], 1))
        for start in range(0, len(idx), step):
            yield idx[start:start + step]


def f_at_zero(run, count: int) -> list:
    """F of every integral with its attention at 0: one row each, no backward."""
    f0 = [float("nan")] * count
    owner = torch.arange(count)
    for part, _g, f in run(owner, torch.zeros(count, dtype=torch.float64), None):
        for i, value in zip(owner[part].tolist(), f.tolist()):  # one copy to the host per pass
            f0[i] = value
    return f0


def node_sum(run, count: int, alphas, weights, acc, device, ratio=None, total=None, low=None, summed: bool = False):
    """sum_k w_k g_i(alpha_k) of ``count`` integrals at the same nodes, their rows run by ``run``
    (integral-major): (that sum added to ``total`` [count, ...], the same with the embedded
    rule's w_k x ``ratio``_k added to ``low`` (None without ``ratio``), F at alpha = 0 per
    integral). ``summed``: a pass's rows (all of one integral) are summed before they are added."""
    f0 = [float("nan")] * count
    if len(alphas):
        owner = torch.arange(count).repeat_interleave(len(alphas))
        row_alpha = alphas.repeat(count)
        row_ratio = None if ratio is None else ratio.repeat(count).to(device, acc)
        for part, g, f in run(owner, row_alpha, weights.repeat(count).to(device, acc)):
            total, low = add_rows(total, low, f0, count, owner, part, g, f, row_alpha, row_ratio, summed)
    return total, low, f0


def fixed(sc, count: int, run, grad_at_one, acc, own, zero=None, summed: bool = False):
    """``count`` integrals by the scorer's fixed rule: (G [count, ...], F(0) per integral,
    (nodes, error estimate, cap hit) per integral). ``grad_at_one`` [count, ...]: the clean
    backward's alpha = 1, or None; ``own(i)`` -> (integral i's length or None, its saved
    projections) for the embedded estimate; ``zero()`` -> F(0) per integral where the rule
    lacks alpha = 0 (default: one row each); ``summed`` as for :func:`node_sum`."""
    alphas, weights, ratio, total, low = sc.fixed_nodes(grad_at_one, acc)
    total, low, f0 = node_sum(run, count, alphas, weights, acc, sc.device, ratio, total, low, summed)
    if not bool((alphas == 0).any()):
        f0 = zero() if zero is not None else f_at_zero(run, count)
    items = []
    for i in range(count):
        n, saved = own(i)
        items.append((total[i:i + 1, :, :n], None if low is None else low[i:i + 1, :, :n], saved))
    measured = sc.embedded_measures(items)
    return total, f0, [(len(sc.alphas), err, False) for err in embedded_errors(measured, sc.low)]


def embedded_errors(measured: list, low) -> list[float]:
    """The embedded error estimate of each integral, max |Attr(G) - Attr(G_low)| / max |Attr(G)|
    / d (``low`` = (weights, d)), from :meth:`Integration.embedded_measures` (all brought to the
    host in one copy); nan without an embedded rule."""
    given = [m for m in measured if m is not None]
    host = iter(torch.stack(given).tolist() if given else [])
    return [float("nan") if m is None else adaptive.relative(*next(host)) / low[1] for m in measured]


def to_tol(sc, count: int, run, grad_at_one, f_full, acc, maps: Maps, floors=None, shared: bool = False,
           evaluate=None, on_round=None):
    """``count`` integrals to ``--tol`` in lock-step (one Refinement; those still refining share
    each round's passes): (G [count, ...], F(0) per integral, (nodes, error estimate, cap hit,
    state) per integral). ``grad_at_one`` [count, ...] and ``f_full`` [count]: the clean run's
    alpha = 1 (None: not at hand); ``floors``: the least scale each integral is judged against;
    ``shared``: the integrals are the layers of one example, judged on one scale.
    ``evaluate(owner, keys, alphas, active)`` -> (owner, keys, unweighted dF/dO, F), where a
    caller shares more than rows (default: ``run`` with unit weights); ``on_round(refinement)``
    after each round. Every integral starts from the three nodes (adaptive.coarse_start):
    whichever way its passes run, an example gets the same nodes."""
    known = known_f = None
    if grad_at_one is not None:
        known, known_f = {adaptive.ONE: grad_at_one.to(acc)}, {adaptive.ONE: np.asarray(f_full, dtype=np.float64)}
    refining = adaptive.Refinement(maps.measure, count, sc.options.tol, sc.options.max_nodes, known, known_f,
                                   maps.derivative, coarse=adaptive.coarse_start(), spread=maps.spread)
    refining.shared = shared
    if floors is not None:
        refining.floors = [float(x) for x in floors]

    def rows(owner, keys, alphas):  # one row per wanted pair, unit weights
        ones = torch.ones(len(owner), dtype=acc, device=sc.device)
        return (owner, keys, *rows_of(run, owner, torch.from_numpy(alphas), ones))

    refining.run(rows if evaluate is None else lambda *wanted: evaluate(*wanted, set(refining.active)), on_round)
    results = [refining.result(i) for i in range(count)]
    return refining.g, [r.f[adaptive.ZERO] for r in results], [(r.nodes, r.error, r.capped, r.status) for r in results]


def integrate(sc, count: int, run, grad_at_one, f_full, acc, maps: Maps, own, floors=None, zero=None,
              summed: bool = False):
    """``count`` integrals by the scorer's rule: :func:`to_tol` with ``--tol`` (``f_full``,
    ``maps``, ``floors``), else :func:`fixed` (``own``, ``zero``, ``summed``)."""
    if sc.options.tol is not None:
        return to_tol(sc, count, run, grad_at_one, f_full, acc, maps, floors)
    return fixed(sc, count, run, grad_at_one, acc, own, zero, summed)


JUDGED = {"maps": (), "none": (), "auto": (), "sum": (-3,), "sources": (-3, -2)}  # --keep -> dims summed away


def judged_dims(keep: str) -> tuple:
    """The dimensions of a layer's map [head, query, key] summed away to give what ``keep``
    keeps, on which the tolerance is judged (docs/integration.md, "What the tolerance is judged
    on"): the per-head maps for ``maps`` and ``none`` (its per-head max and top entries), the
    head sum [query, key] for ``sum``, the per-key sums [key] for ``sources``."""
    return JUDGED.get(keep, ())


def _kept(attr: torch.Tensor, dims: tuple) -> torch.Tensor:
    """The map reduced to what is kept, flattened per leading index: [..., entries]."""
    kept = attr.sum(dim=dims) if dims else attr
    return kept.flatten(start_dim=kept.dim() - (3 - len(dims)))


def map_measures(a: torch.Tensor, v: torch.Tensor, g: torch.Tensor, dims: tuple = ()) -> torch.Tensor:
    """(max |Attr|, sum |Attr|, sum Attr) per leading index of the maps Attr = A * (G V^T):
    A [..., head, n, n], V and G [..., head, n, d] -> [..., 3] (sums in float64); with ``dims``
    (:func:`judged_dims`) of the map summed over those dimensions first. Several G at once
    ([k, head, n, d]; A and V shared, or one per G) are measured a chunk of about SPREAD_CHUNK
    map entries at a time: a refinement round measures every new leaf of every step, dozens of
    n x n maps at a long input (docs/long-context.md, "Peak memory")."""
    if g.dim() == 4 and len(g) > 1:
        def own(x):  # one per G (else one for all, [head, ...] or [1, head, ...])
            return x.dim() == 4 and len(x) == len(g)

        step = max(1, SPREAD_CHUNK // max(a[0].numel() if own(a) else a.numel(), 1))
        if len(g) > step:
            return torch.cat([map_measures(a[i:i + step] if own(a) else a, v[i:i + step] if own(v) else v,
                                           g[i:i + step], dims) for i in range(0, len(g), step)])
    kept = _kept(a * torch.matmul(g, v.transpose(-1, -2)), dims)
    return torch.stack([kept.abs().amax(dim=-1).double(), kept.abs().sum(dim=-1, dtype=torch.float64),
                        kept.sum(dim=-1, dtype=torch.float64)], dim=-1)


def map_spread(a: torch.Tensor, v: torch.Tensor, g: torch.Tensor, dims: tuple = ()) -> torch.Tensor:
    """max over the entries of sum_k |Attr_k|, the maps Attr_k = A * (G_k V^T) of one integral's
    leaves (each summed over ``dims`` first): A [head, n, n], V [head, n, d] and G [k, head, n, d]
    -> a float64 scalar. The maps are made and added in chunks of about SPREAD_CHUNK entries (a
    long input's map is large, and a layer may hold dozens of leaves)."""
    vt = v.transpose(-1, -2)
    step = max(1, SPREAD_CHUNK // max(a.numel(), 1))
    total = None
    for start in range(0, len(g), step):
        part = _kept(a * torch.matmul(g[start:start + step], vt), dims).abs().sum(0, dtype=torch.float64)
        total = part if total is None else total.add_(part)
    return total.amax()


SPREAD_CHUNK = 1 << 24  # map entries made at once by map_spread (64 MiB in float32)
