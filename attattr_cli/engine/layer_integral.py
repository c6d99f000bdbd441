"""One layer's integral: G = sum_k w_k dF/dO(alpha_k) by a fixed rule (with its embedded error
estimate) or to a tolerance (engine/adaptive.py), the passes that give dF/dO at the nodes in
micro-batches that fit memory, and the map measures the estimates read. A part of
:class:`~attattr_cli.engine.scorer.Scorer` (its integration), kept apart from the result
assembly (engine/assembly.py) and the encoding and targets (engine/scorer.py)."""

from __future__ import annotations

import torch

from ..ops import reference, reference_mask, with_causal
from . import adaptive, attention, memory
from .encoding import Encoded
from .options import DEFAULT_TOL


class Integration:
    """The Scorer's integration (a mixin: it uses the scorer's model, options, sites and
    backend)."""

    # the passes of every target layer of an example in one sweep per round (engine/sweep.py);
    # False: one pass per target layer (benches compare the two; the numbers agree)
    sweep = True

    # -- step micro-batching ------------------------------------------------------
    def auto_step_batch(self, enc: Encoded, site, steps: int | None = None) -> int:
        """Steps per pass (at most ``steps``, default all) that fit the free memory of the
        device: an estimate of the activations kept for the backward through the layers
        at and above the target. ``--step-batch`` overrides it."""
        if self.options.step_batch is not None:
            return self.options.step_batch
        steps = len(self.alphas) if steps is None else steps
        n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
        return memory.steps_that_fit(self.step_bytes(enc, site), steps, n, self.device,
                                     memory.hidden_size(self.model.config))

    def step_bytes(self, enc: Encoded, site) -> int:
        """Estimated bytes one integration step of ``site`` keeps (see ``memory.step_bytes``)."""
        n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
        kept = len(enc.lm_positions) if enc.lm_positions is not None else 1
        return memory.step_bytes(self.model.config, self.arch, site, n, self.dtype, self.device, kept, self.options.lm)

    def _integrate(self, enc: Encoded, site, target, clean, grad_at_one: torch.Tensor | None = None,
                   f_full: float | None = None, floor: float = 0.0) -> tuple[torch.Tensor, float]:
        """G = sum_k w_k dF/dO_k for the target site, and F with its attention at 0.

        ``grad_at_one`` is dF/dO at alpha = 1 from the clean forward's backward (F there:
        ``f_full``); that node is then not recomputed. Steps run in micro-batches that fit memory; a CUDA
        out-of-memory error halves the micro-batch and retries. ``floor``: the least scale ``--tol``
        judges the layer against (the example's largest kept number so far; engine/adaptive.py).
        """
        family, layer = site
        acc_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        if self.options.tol is not None:
            return self._integrate_to_tol(enc, site, target, clean, grad_at_one, acc_dtype, f_full, floor)
        alphas, weights, ratio, g_sum, g_low = self.fixed_nodes(grad_at_one, acc_dtype)
        zero = torch.nonzero(alphas == 0)
        zero_at = int(zero[0]) if len(zero) else None
        f0 = float("nan")
        chunk = self.auto_step_batch(enc, site, len(alphas)) if len(alphas) else 1
        saved = None
        weights = weights.to(self.device, acc_dtype)
        run = lambda part: self._step_chunk(enc, site, target, clean, alphas[part], weights[part])  # noqa: E731
        for part, (grads, f, saved) in self._back_off.chunks(len(alphas), chunk, run, self.warn):
            if ratio is not None:
                low = (grads * ratio[part].to(grads).view(-1, *[1] * (grads.dim() - 1))).sum(0, keepdim=True)
                g_low = low if g_low is None else g_low + low
            grads = grads.sum(0, keepdim=True)
            g_sum = grads if g_sum is None else g_sum + grads
            if zero_at is not None and part.start <= zero_at < part.stop:
                f0 = float(f[zero_at - part.start])
            self.last_step_batch = max(self.last_step_batch, part.stop - part.start)
            del f, grads
        if zero_at is None:  # F(0): one forward at batch 1, no backward
            plan = attention.Attribute(layer, torch.zeros(1, dtype=torch.float64, device=self.device), self.backend,
                                       family=family)
            with self.sites.target_pass(site, clean, plan), torch.no_grad():
                f0 = float(self._target_value(
                    self._logits(enc, 1, self.sites.extra_inputs(site, clean, 1)), target)[0])
            if saved is None:
                saved = plan.saved
        self._saved = saved
        self.last_integral = (len(self.alphas), self.embedded_error(g_sum, g_low), False)
        return g_sum, f0

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

    def _integrate_to_tol(self, enc: Encoded, site, target, clean, grad_at_one, acc_dtype, f_full, floor: float = 0.0):
        """G and F(0) by the error-controlled integration of engine/adaptive.py."""
        def evaluate(alphas: torch.Tensor):  # unweighted dF/dO per alpha, in micro-batches
            ones = torch.ones(len(alphas), dtype=acc_dtype, device=self.device)
            run = lambda part: self._step_chunk(enc, site, target, clean, alphas[part], ones[part])  # noqa: E731
            grads, fs = [], []
            for part, (g, f, self._saved) in self._back_off.chunks(
                    len(alphas), self.auto_step_batch(enc, site, len(alphas)), run, self.warn):
                grads.append(g)
                fs.append(f)
                self.last_step_batch = max(self.last_step_batch, part.stop - part.start)
            return torch.cat(grads), torch.cat(fs)

        known = {} if grad_at_one is None else {adaptive.ONE: grad_at_one.to(acc_dtype)[0]}
        known_f = {} if grad_at_one is None else {adaptive.ONE: f_full}
        def derivative(g: torch.Tensor) -> torch.Tensor:  # sum Attr = <G, A V> per row (dF/dalpha at a node)
            s = self._saved
            if "out" not in s:
                s["out"] = torch.matmul(self.layer_probs(s, g.dtype), s["v"].to(g.dtype))
            return (g.reshape(len(g), *s["out"].shape[-3:]) * s["out"]).sum(dim=(-3, -2, -1), dtype=torch.float64)

        def spread(g: torch.Tensor) -> torch.Tensor:  # the leaves' maps summed entry by entry (adaptive.Refinement)
            s = self._saved
            return map_spread(self.layer_probs(s, g.dtype), s["v"].to(g.dtype), g.reshape(len(g), *g.shape[-3:]),
                              self.judged)

        # the three-node start, as in sweeps (engine/sweep.py) and groups: an example gets the same
        # nodes whichever way its passes run
        res = adaptive.integrate(evaluate, self._measure, self.options.tol, self.options.max_nodes, known, known_f,
                                 derivative, coarse=adaptive.coarse_start(), spread=spread,
                                 floor=floor)
        self.last_integral = (res.nodes, res.error, res.capped, res.status)
        return res.g.unsqueeze(0), res.f[adaptive.ZERO]

    def embedded_error(self, g: torch.Tensor, g_low: torch.Tensor | None, saved: dict | None = None) -> float:
        """The fixed rule's error estimate from its embedded lower-order rule: max |Attr(G) -
        Attr(G_low)| / max |Attr(G)| / d (``self.low``); nan without an embedded rule."""
        if g_low is None:
            return float("nan")
        return adaptive.relative(self._measure(g - g_low, saved)[0], self._measure(g, saved)[0]) / self.low[1]

    @property
    def check_tol(self) -> float:
        """The tolerance convergence is judged at: --tol, or for a fixed rule the default's."""
        return self.options.tol if self.options.tol is not None else DEFAULT_TOL

    def _measure(self, g: torch.Tensor, saved: dict | None = None) -> tuple[float, float, float]:
        """(max |Attr|, sum |Attr|, sum Attr) of the map made from ``g`` with the saved
        projections (``self._saved`` by default); the map itself is not kept."""
        s = self._saved if saved is None else saved
        g = g.reshape(1, *g.shape[-3:])
        return tuple(float(x) for x in map_measures(self.layer_probs(s, g.dtype), s["v"].to(g.dtype), g,
                                                    self.judged)[0])

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

    def _step_chunk(self, enc: Encoded, site, target, clean, a: torch.Tensor, w: torch.Tensor):
        """One micro-batch of steps: (w_k dF/dO_k per step, F at its alphas, saved Q/K/V)."""
        family, layer = site
        acc_dtype = w.dtype
        plan = attention.Attribute(layer, a.to(self.device), self.backend, family=family)
        with self.sites.target_pass(site, clean, plan), torch.enable_grad():
            logits = self._logits(enc, len(a), self.sites.extra_inputs(site, clean, len(a)))
            f = self._target_value(logits, target)
            if plan.leaf is None:
                raise attention.not_routed(self.arch.model_type, family, layer)
            (g,) = torch.autograd.grad((f * w).sum(), plan.leaf)
        return g.to(acc_dtype), f.detach(), plan.saved

    def _attribute(self, g: torch.Tensor, want_maps: bool = True, saved: dict | None = None) -> dict:
        s = self._saved if saved is None else saved
        self.last_kernel = self.backend.name if self.backend.supports(s["q"], s["mask"], s["softcap"]) else "torch"
        return self.backend.attribution_from_grad(
            s["q"], s["k"], s["v"], g, mask=s["mask"], scale=s["scale"], softcap=s["softcap"],
            causal=s["causal"], want_maps=want_maps,
        )




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
    n x n maps at a long input (9.7 GB peak at 1,063 tokens and five steps, made at once)."""
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
