"""One sweep per round: the integration passes of every target layer of an example go through
the layer stack together.

Per target layer l the nodes' rows run the layers l..L-1 (the layers below replay the clean
forward) and one backward gives dF/dO at l. Those rows are independent of the other target
layers' rows, so a round of the refinement (or a whole fixed rule) can put the rows of every
layer into one batch: layer j runs the rows whose target is at or below j, the rows with a
higher target keep the clean output of j (which is what their own pass would have seen
there), the rows targeting j take the alpha-scaled clean A V as a leaf, and one backward of
the sum of every row's F gives each leaf its rows' gradients (a row's F depends on its own
leaf only). The numbers are those of one pass per layer up to float rounding (a matrix
product of another shape sums in another order); tests/test_sweep.py holds the two paths to
each other and the architecture matrix scores every model type through sweeps.

What it buys: a pass over a few rows of a short input is bound by reading the weights and by
the fixed cost of a pass, not by its rows (SmolLM2-135M at 5 tokens: 7.3 ms per layer's forward and
backward at one row, 9.9 ms at four), and per-layer passes read layer j's weights once for
every target at or below j in every round. A sweep reads each layer once per round with all
its rows. Inputs longer than MAX_TOKENS are scored one layer per pass: their passes are full
already, and a sweep would keep every layer's node gradients at once.

Where a model's layers do not run as a sweep needs them (a target layer's attention went
elsewhere: attention sinks, or a layer returns something other than its hidden states), the
scorer falls back to one pass per layer for that model (``attention.NotSweepable``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from . import adaptive, attention
from .layer_integral import map_measures, map_spread
from .rows import add_rows

MAX_TOKENS = 256  # longer inputs: one pass per target layer (full passes, node gradients of one layer kept)
# on a CUDA device a pass of 19 rows is not full even at 1,024 tokens: BERT-base, bf16, m = 20,
# 12 target layers on an H100, seconds per example one pass per layer / sweeps: 0.42 / 0.27 at
# 512 tokens, 0.48 / 0.34 at 1,024, 0.78 / 0.77 at 2,048 (rows per sweep chunked to fit memory):
# no gain at 2,048, where the per-layer passes are what bench_long_decoder.py --gpu measured
CUDA_MAX_TOKENS = 1024


def max_tokens(device: torch.device) -> int:
    """The longest input scored by sweeps on ``device``."""
    return CUDA_MAX_TOKENS if device.type == "cuda" else MAX_TOKENS


def usable(sc, enc, family: str, layers: list[int]) -> bool:
    """Whether ``family``'s layers of this example are scored by sweeps."""
    n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
    return (sc.sweep and getattr(sc, "_sweeps_work", True) and len(layers) > 1 and n <= max_tokens(sc.device)
            and sc.sites.sweepable(family))


def _pass(sc, enc, family: str, target, clean, row_layer: torch.Tensor, alphas: torch.Tensor,
          weights: torch.Tensor | None, saved: dict):
    """One sweep over rows (target layer ``row_layer[r]`` at ``alphas[r]``, ascending by layer):
    (w_r dF/dO_r per row, or None without weights; F per row). Fills ``saved`` per layer."""
    plan = attention.Sweep(family, row_layer, alphas.to(sc.device), sc.backend)
    wanted = sorted(set(row_layer.tolist()))
    with sc.sites.sweep_pass(family, clean, plan), torch.set_grad_enabled(weights is not None):
        logits = sc._logits(enc, len(alphas))
        f = sc._target_value(logits, target)
        leaves = _leaves(plan, wanted, same_shape=weights is not None)
        g = None if weights is None else torch.cat(torch.autograd.grad((f * weights.to(f)).sum(), leaves))
    for layer in wanted:
        saved.setdefault(layer, plan.saved[layer])
    return g, f.detach()


def _leaves(plan, wanted: list[int], same_shape: bool) -> list[torch.Tensor]:
    """The leaves of a sweep's target layers ``wanted``, in order; NotSweepable where one of them
    did not run through the sweep or (``same_shape``: their gradients are to be stacked) where
    their shapes differ."""
    missing = [layer for layer in wanted if layer not in plan.leaves]
    if missing:
        raise attention.NotSweepable(f"layer {missing[0]}'s attention did not run through the sweep")
    leaves = [plan.leaves[layer] for layer in wanted]
    if same_shape and len({tuple(x.shape[1:]) for x in leaves}) > 1:
        raise attention.NotSweepable("layers of different attention shapes")
    return leaves


def shared_pass(sc, enc, family: str, values, clean, row_layer: torch.Tensor, alphas: torch.Tensor,
                weights: torch.Tensor, saved: dict):
    """One sweep whose rows serve several targets at once (a generation's steps: the pass at
    (layer, alpha) is the same forward for every step, only F differs): ``values(logits)`` ->
    F [rows, targets]; ``weights`` [targets, rows] the rows each target wants. One forward,
    then one backward per target with rows (without weight gradients a backward costs about
    a forward). Returns ([per target: dF/dO of every row, or None], F [rows, targets])."""
    plan = attention.Sweep(family, row_layer, alphas.to(sc.device), sc.backend)
    wanted = sorted(set(row_layer.tolist()))
    with sc.sites.sweep_pass(family, clean, plan), torch.enable_grad():
        f = values(sc._logits(enc, len(alphas)))
        leaves = _leaves(plan, wanted, same_shape=True)
        used = [t for t in range(weights.shape[0]) if bool(weights[t].any())]
        grads: list = [None] * weights.shape[0]
        for i, t in enumerate(used):
            gs = torch.autograd.grad((f[:, t] * weights[t].to(f)).sum(), leaves, retain_graph=i < len(used) - 1)
            grads[t] = torch.cat(gs)
    for layer in wanted:
        saved.setdefault(layer, plan.saved[layer])
    return grads, f.detach()


def same_shapes(at_one: dict, family: str, layers: list[int]) -> None:
    """NotSweepable where the layers' attention outputs differ in shape (heads or head width
    per layer): their node gradients cannot share one batch."""
    if len({tuple(g.shape[1:]) for (fam, layer), g in at_one.items() if fam == family and layer in layers}) > 1:
        raise attention.NotSweepable("layers of different attention shapes")


def _one_target(target):
    return lambda part: (target, contextlib.nullcontext())


def run_rows(sc, enc, family, targets, clean, row_layer, alphas, weights, saved, acc):
    """Sweeps over all rows in chunks that fit memory (halved on an out-of-memory error):
    (gradients or None, F) of every row, in row order. ``targets(part)`` -> (the target of
    the rows ``part``, a context to run their pass in)."""
    lowest = (family, int(row_layer.min()))
    size = sc.auto_step_batch(enc, lowest, len(alphas))

    def run(part):
        w = None if weights is None else weights[part]
        target, context = targets(part)
        with context:
            return _pass(sc, enc, family, target, clean, row_layer[part], alphas[part], w, saved)

    gs, fs = [], []
    for part, (g, f) in sc._back_off.chunks(len(alphas), size, run, sc.warn):
        sc.last_step_batch = max(sc.last_step_batch, part.stop - part.start)
        if g is not None:
            gs.append(g.to(acc))
        fs.append(f)
    return (torch.cat(gs) if gs else None), torch.cat(fs)


def integrate(sc, enc, family: str, layers: list[int], target, clean, at_one: dict, f_full: float,
              on_layer=None) -> list:
    """Every layer of ``family`` integrated by sweeps: per layer (G [1, ...], F(0), saved
    projections, (nodes, error estimate, cap hit[, state])), as the scorer's per-layer
    ``_integrate`` gives them; ``on_layer(layer)`` as each layer's integral is done. Raises
    attention.NotSweepable where the model cannot sweep."""
    acc = torch.float64 if sc.dtype == torch.float64 else torch.float32
    saved: dict = {}
    targets = _one_target(target)
    same_shapes(at_one, family, layers)
    if sc.options.tol is not None:
        ones = [at_one.get((family, layer)) for layer in layers]
        known = None if any(x is None for x in ones) else torch.cat(ones)
        refining = refine(sc, enc, family, layers, 1, clean, known, np.array([f_full], dtype=np.float64),
                          lambda part, steps: targets(part), saved, acc, on_layer=on_layer)
        out = []
        for i, layer in enumerate(layers):
            r = refining.result(i)
            out.append((r.g.unsqueeze(0), r.f[adaptive.ZERO], saved[layer], (r.nodes, r.error, r.capped, r.status)))
        return out
    count = len(layers)
    ones = [at_one.get((family, layer)) for layer in layers]
    stacked = torch.cat(ones) if all(x is not None for x in ones) else None
    alphas, weights, ratio, total, low = sc.fixed_nodes(stacked, acc)
    layer_ids = torch.tensor(layers, dtype=torch.long)
    f0 = [float("nan")] * count
    m = len(alphas)
    if m:
        owner = torch.arange(count).repeat_interleave(m)
        row_alpha = alphas.repeat(count)
        row_w = weights.repeat(count).to(sc.device, acc)
        g, f = run_rows(sc, enc, family, targets, clean, layer_ids[owner], row_alpha, row_w, saved, acc)
        row_ratio = None if ratio is None else ratio.repeat(count).to(g.device, acc)
        total, low = add_rows(total, low, f0, count, owner, slice(None), g, f, row_alpha, row_ratio)
    if not bool((alphas == 0).any()):  # F(0) of every layer: one sweep without a backward
        _g, f = run_rows(sc, enc, family, targets, clean, layer_ids, torch.zeros(count, dtype=torch.float64), None,
                     saved, acc)
        f0 = [float(x) for x in f]
    out = []
    for i, layer in enumerate(layers):
        if on_layer is not None:
            on_layer(layer)
        g_i = total[i:i + 1]
        g_low = None if low is None else low[i:i + 1]
        out.append((g_i, f0[i], saved[layer], (len(sc.alphas), sc.embedded_error(g_i, g_low, saved[layer]), False)))
    return out


def refine(sc, enc, family, layers, per_layer: int, clean, known, known_f, targets, saved, acc,
           coarse: bool | None = None, evaluate=None, on_layer=None) -> adaptive.Refinement:
    """``--tol`` by sweeps: one Refinement whose integrals are ``per_layer`` per layer (the
    steps of a generation; one for an example), integral i = (layer i // per_layer, i %
    per_layer); each round's wanted nodes of every integral in one sweep (rows ascending by
    layer). ``known`` [layers x per_layer, ...] and ``known_f`` [per_layer]: the clean
    backward's alpha = 1, or None. ``targets(part, which)`` -> (target of those rows, a
    context for their pass), ``which`` the rows' index within their layer. The three-node
    start (coarse): in a sweep every node is rows, as in a group's pass (adaptive.coarse_start).
    ``evaluate(owner, keys, alphas, row_layer, active)`` -> (owner, keys, unweighted dF/dO,
    F) of the wanted pairs and of any more it has at hand for integrals still ``active``,
    where a caller shares more than rows (engine/generation.py); default: one row per pair.
    ``on_layer(layer)`` once all of a layer's integrals are done (progress)."""
    count = len(layers) * per_layer
    layer_ids = torch.tensor(layers, dtype=torch.long)
    a_v: dict = {}

    def stacks(i, dtype):
        if i not in a_v:
            s = saved[layers[i]]
            a = sc.layer_probs(s, dtype)
            v = s["v"].to(dtype)
            a_v[i] = (a, v, torch.matmul(a, v))
        return a_v[i]

    def measure(g, rows):  # (max |Attr|, sum |Attr|, sum Attr) per row, each with its layer's A and V
        out = torch.empty((len(rows), 3), dtype=torch.float64)
        of_layer = rows // per_layer
        for i in torch.unique(of_layer).tolist():
            sel = torch.nonzero(of_layer == i).flatten()
            a, v, _ = stacks(i, g.dtype)
            out[sel] = map_measures(a, v, g[sel.to(g.device)], sc.judged).cpu()
        return out

    def spread(g, rows):  # one integral's leaves: max over entries of sum |Attr| (adaptive.Refinement)
        a, v, _ = stacks(int(rows[0]) // per_layer, g.dtype)
        return map_spread(a, v, g, sc.judged).cpu()

    def derivative(g, rows):  # sum Attr = <G, A V> per row (dF/dalpha at a node)
        out = torch.empty(len(rows), dtype=torch.float64)
        of_layer = rows // per_layer
        for i in torch.unique(of_layer).tolist():
            sel = torch.nonzero(of_layer == i).flatten()
            out[sel] = (g[sel.to(g.device)] * stacks(i, g.dtype)[2]).sum(dim=(-3, -2, -1), dtype=torch.float64).cpu()
        return out

    k = k_f = None
    if known is not None:
        k = {adaptive.ONE: known.to(acc)}
        k_f = {adaptive.ONE: np.tile(np.asarray(known_f, dtype=np.float64), len(layers))}
    refining = adaptive.Refinement(measure, count, sc.options.tol, sc.options.max_nodes, k, k_f, derivative,
                                   coarse=adaptive.coarse_start() if coarse is None else coarse, spread=spread)
    refining.shared = sc.options.keep == "sources" and per_layer == 1  # the kept table [layer, key] judged as a whole
    reported: set = set()
    while not refining.done:
        owner, keys, alphas = refining.wanted()  # integral-major: ascending by layer
        row_layer = layer_ids[owner // per_layer]
        if evaluate is not None:
            owner, keys, g, f = evaluate(owner, keys, alphas, row_layer, set(refining.active))
        else:
            which = owner % per_layer
            ones_w = torch.ones(len(owner), dtype=acc, device=sc.device)
            g, f = run_rows(sc, enc, family, lambda part: targets(part, which[part]), clean, row_layer,
                        torch.from_numpy(alphas), ones_w, saved, acc)
        refining.give(owner, keys, g, f)
        if on_layer is not None:
            active = {i // per_layer for i in refining.active}
            for i in range(len(layers)):
                if i not in active and i not in reported:
                    reported.add(i)
                    on_layer(layers[i])
    return refining
