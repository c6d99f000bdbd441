"""One sweep per round: the integration passes of every target layer of an example go through
the layer stack together (docs/method.md 1.4, fact 8; figures in docs/benchmarks.md, "Sweeps").

In one batch, layer j runs the rows whose target is at or below j; rows with a higher target keep
the clean output of j (what their own pass would have seen there); rows targeting j take the
alpha-scaled clean A V as a leaf; one backward of the sum of every row's F gives each leaf its
rows' gradients: the numbers of one pass per layer up to float rounding (tests/test_sweep.py).
Inputs longer than MAX_TOKENS, and models whose layers do not run as a sweep needs them
(``attention.NotSweepable``), are scored one layer per pass.
"""

from __future__ import annotations

import numpy as np
import torch

from . import attention
from .layer_integral import Maps, fixed, one_target, to_tol
from .rows import to_device

MAX_TOKENS = 256  # longer inputs: one pass per target layer (full passes, node gradients of one layer kept)
# on a CUDA device a pass of 19 rows is not full even at 1,024 tokens; sweeps gain nothing at
# 2,048 (H100 figures: docs/benchmarks.md, "GPU, kernels and the rest")
CUDA_MAX_TOKENS = 1024


def max_tokens(device: torch.device) -> int:
    """The longest input scored by sweeps on ``device``."""
    return CUDA_MAX_TOKENS if device.type == "cuda" else MAX_TOKENS


def usable(sc, enc, family: str, layers: list[int]) -> bool:
    """Whether ``family``'s layers of this example are scored by sweeps."""
    n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
    return (sc.sweep and sc.sweeps_work and len(layers) > 1 and n <= max_tokens(sc.device)
            and sc.sites.sweepable(family))


def _pass(sc, enc, family: str, target, clean, row_layer: torch.Tensor, alphas: torch.Tensor,
          weights: torch.Tensor | None, saved: dict, used: bool = True):
    """One sweep over rows (target layer ``row_layer[r]`` at ``alphas[r]``, ascending by layer):
    (w_r dF/dO_r per row, or None without weights (or, ``used`` False, with weights all zero);
    F per row). Fills ``saved`` per layer. With ``ATTATTR_CUDA_GRAPHS=1`` the sweep goes through
    ops/graphs.py's CapturedPass as a per-layer pass does (captured once per shapes, rows' layers
    and target, replayed for every later example like them; its plan made outside the capture
    and kept with the graph; eager elsewhere, with the same numbers)."""
    from ..ops import graphs  # (not at import: the dispatch-mode machinery stays unloaded)

    def values(logits):
        return sc.target_value(logits, target)[:, None]

    def one_pass(a: torch.Tensor, w: torch.Tensor | None = None, plan=None, into: dict = saved):
        grads, f = shared_pass(sc, enc, family, values, clean, row_layer, a, None if w is None else w[None], into,
                               used=[0] if used else [], plan=plan)
        return grads[0], f[:, 0]

    if not (graphs.enabled() and getattr(clean, "static", False)):
        return one_pass(alphas, weights)
    key = ("sweep", sc.pass_key(enc), family, tuple(row_layer.tolist()), repr(target), weights is None, used)
    captured = sc.captured_passes()
    plan = captured.held.get(key)
    if plan is None:  # its index tensors are read by every replay: made once, before any capture
        plan = captured.held[key] = attention.Sweep(family, row_layer, alphas, sc.backend)

    def graphed(a: torch.Tensor, w: torch.Tensor | None = None):
        own: dict = {}
        g, f = one_pass(a, w, plan, own)
        return ((f,) if g is None else (g, f)), own

    out, own = captured.run(key, graphed, *((alphas,) if weights is None else (alphas, weights)))
    for layer, projections in own.items():
        if layer not in saved:
            saved[layer] = graphs.owned(projections)
    return (None if len(out) == 1 else out[0]), out[-1]


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
                weights: torch.Tensor | None, saved: dict, used: list | None = None, plan=None):
    """One sweep whose rows serve several targets at once (a generation's steps: the pass at
    (layer, alpha) is the same forward for every step, only F differs): ``values(logits)`` ->
    F [rows, targets]; ``weights`` [targets, rows] the rows each target wants (None: F alone).
    One forward, then one backward per target with rows (without weight gradients a backward
    costs about a forward). ``used``: the targets whose weights are not all zero, where the
    caller knows them on the host (None: asked of ``weights``); ``plan``: the attention.Sweep of
    these rows made before (a captured pass's), run at ``alphas``. Returns ([per target: dF/dO of
    every row, or None], F [rows, targets])."""
    if plan is None:
        plan = attention.Sweep(family, row_layer, alphas.to(sc.device), sc.backend)
    else:
        plan.alphas = alphas
    wanted = sorted(set(row_layer.tolist()))
    with sc.sites.sweep_pass(family, clean, plan), torch.set_grad_enabled(weights is not None):
        f = values(sc.logits(enc, len(alphas)))
        leaves = _leaves(plan, wanted, same_shape=weights is not None)
        grads = per_target(f, weights, leaves, used)
    for layer in wanted:
        saved.setdefault(layer, plan.saved[layer])
    return grads, f.detach()


def per_target(f: torch.Tensor, weights: torch.Tensor | None, leaves: list, used: list | None = None) -> list:
    """Per target t (F ``f[:, t]``) with rows in ``weights[t]``: sum_r weights[t, r] dF_t/dO_r at
    the ``leaves`` (concatenated), one backward each through the same forward; None for the
    others (all: without weights). ``used``: those targets with a weight not zero, known on the
    host (None: asked of the device, a host synchronisation per target)."""
    if weights is None:
        used = []
    elif used is None:
        used = [t for t in range(weights.shape[0]) if bool(weights[t].any())]
    grads: list = [None] * (1 if weights is None else weights.shape[0])
    for i, t in enumerate(used):
        grads[t] = torch.cat(torch.autograd.grad((f[:, t] * weights[t].to(f)).sum(), leaves,
                                                 retain_graph=i < len(used) - 1))
    return grads


def same_shapes(at_one: dict, family: str, layers: list[int]) -> None:
    """NotSweepable where the layers' attention outputs differ in shape (heads or head width
    per layer): their node gradients cannot share one batch."""
    if len({tuple(g.shape[1:]) for (fam, layer), g in at_one.items() if fam == family and layer in layers}) > 1:
        raise attention.NotSweepable("layers of different attention shapes")


def runner(sc, enc, family: str, targets, clean, layer_of, saved: dict, acc):
    """``run(owner, alphas, weights)`` (engine/layer_integral.py) over sweeps in chunks that fit
    memory (halved on an out-of-memory error), integral ``owner[r]``'s target layer
    ``layer_of(owner)[r]`` (rows ascending by layer). ``targets(part, owner)`` -> (the target
    of the rows ``part``, integrals ``owner``, a context to run their pass in)."""
    def run(owner, alphas, weights):
        row_layer = layer_of(owner)
        # before the passes, once per round: the alphas on the device and which rows carry a
        # weight on the host, so that no pass copies from or waits for the device (issue 53)
        on_device = to_device(alphas, sc.device)
        weighted = None if weights is None else (weights != 0).tolist()

        def one(part):
            target, context = targets(part, owner[part])
            with context:
                return _pass(sc, enc, family, target, clean, row_layer[part], on_device[part],
                             None if weights is None else weights[part], saved,
                             used=weights is None or any(weighted[part]))

        size = sc.auto_step_batch(enc, (family, int(row_layer.min())), len(alphas))
        for part, (g, f) in sc.back_off.chunks(len(alphas), size, one, sc.warn):
            sc.last_step_batch = max(sc.last_step_batch, part.stop - part.start)
            yield part, None if g is None else g.to(acc), f
    return run


def integrate(sc, enc, family: str, layers: list[int], target, clean, at_one: dict, f_full: float,
              on_layer=None) -> list:
    """Every layer of ``family`` integrated by sweeps: per layer (G [1, ...], F(0), saved
    projections, (nodes, error estimate, cap hit[, state])), as the scorer's per-layer
    ``integrate`` gives them; ``on_layer(layer)`` as each layer's integral is done. Raises
    attention.NotSweepable where the model cannot sweep."""
    saved: dict = {}
    same_shapes(at_one, family, layers)
    ones = [at_one.get((family, layer)) for layer in layers]
    known = torch.cat(ones) if all(x is not None for x in ones) else None
    if sc.options.tol is not None:
        g, f0, convs = refine(sc, enc, family, layers, 1, clean, known, [f_full], one_target(target), saved, sc.acc,
                              on_layer=on_layer)
    else:
        layer_ids = torch.tensor(layers, dtype=torch.long)
        run = runner(sc, enc, family, one_target(target), clean, lambda owner: layer_ids[owner], saved, sc.acc)
        g, f0, convs = fixed(sc, len(layers), run, known, sc.acc, lambda i: (None, saved[layers[i]]))
        for layer in layers if on_layer is not None else []:
            on_layer(layer)
    return [(g[i:i + 1], f0[i], saved[layer], convs[i]) for i, layer in enumerate(layers)]


def refine(sc, enc, family, layers, per_layer: int, clean, known, known_f, targets, saved, acc,
           evaluate=None, on_layer=None):
    """``--tol`` by sweeps (engine/layer_integral.py's ``to_tol``): integrals ``per_layer`` per
    layer (the steps of a generation; one for an example), integral i = (layer i // per_layer,
    i % per_layer); each round's wanted nodes of every integral in one sweep (rows ascending by
    layer). ``known`` [layers x per_layer, ...] and ``known_f`` [per_layer]: the clean
    backward's alpha = 1, or None. ``targets(part, owner)`` -> (target of those rows, a context
    for their pass). ``evaluate(owner, keys, alphas, row_layer, active)`` -> (owner, keys,
    unweighted dF/dO, F) of the wanted pairs and of any more it has at hand for integrals still
    ``active``, where a caller shares more than rows (engine/generation.py); default: one row
    per pair. ``on_layer(layer)`` once all of a layer's integrals are done (progress). Returns
    what ``to_tol`` does."""
    layer_ids = torch.tensor(layers, dtype=torch.long)
    run = runner(sc, enc, family, targets, clean, lambda owner: layer_ids[owner // per_layer], saved, acc)
    maps = Maps(sc.judged, lambda i: saved[layers[i]], key=lambda rows: rows // per_layer)
    reported: set = set()

    def on_round(refining):
        active = {i // per_layer for i in refining.active}
        for i in range(len(layers)):
            if i not in active and i not in reported:
                reported.add(i)
                on_layer(layers[i])

    return to_tol(sc, len(layers) * per_layer, run, known, None if known is None else np.tile(
        np.asarray(known_f, dtype=np.float64), len(layers)), acc, maps,
        shared=sc.options.keep == "sources" and per_layer == 1,
        evaluate=None if evaluate is None else (
            lambda owner, keys, alphas, active: evaluate(owner, keys, alphas, layer_ids[owner // per_layer], active)),
        on_round=None if on_layer is None else on_round)
