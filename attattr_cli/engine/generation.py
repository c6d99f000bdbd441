"""A generation attributed step by step (``--generate``, ``--continuation --per-step``).

A prompt of P tokens followed by S tokens g_0 .. g_{S-1}: the model sees x = prompt + g_0 ..
g_{S-2}, and step t's target is F_t = out(g_t | x_0 .. x_{p_t}), read at position p_t = P - 1 + t
(minus the foil's output with ``--foil``). One clean forward of x serves every step (causal
masking makes its prefix the prefix's own forward), and so does F at alpha = 0; a pass's rows
hold nodes of several steps (each row's F reads its own row only; one backward of sum_r w_r F_r),
or, where the steps want the same nodes, one forward per node serves them all with a backward per
step (:meth:`StepScorer._shared`). Step t's map is cropped to its p_t + 1 tokens; the example's
own maps are those of F = sum_t F_t. Why this is exact: docs/method.md, section 1.5.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.types import Example
from ..errors import DataError, OptionError
from . import adaptive, attention, sweep
from .encoding import Encoded
from .layer_integral import Maps, fixed, integrate, one_target, rows_of
from .rows import crop_saved
from .scorer import Scorer


# steps share one forward per node (StepScorer._shared) where the nodes the steps want, taken
# together, are at most this many times the rows they ask for (fixed rules, --tol's first level)
SHARED_SLACK = 1.25
# elsewhere, on inputs this long (a pass's rows fill its products at one node per pass), a node
# wanted by several steps is one forward and a backward per step that wants it (StepScorer._shared)
LONG_SHARED = 256


@dataclass
class StepScore:
    """One generated token's attribution (``ExampleScore.steps``; docs/store.md)."""

    step: int
    position: int  # the position whose next token is the target (its prefix: position + 1 tokens)
    target: int  # the token id
    target_token: str
    pred: int  # the arg-max next token at the position
    f_full: float
    logit: float
    prob: float
    family: object  # FamilyScore of the prefix (no attention: the example's holds it)
    foil: int | None = None
    extra: dict = field(default_factory=dict)


class StepTargets:
    """Per-row targets of a pass holding several steps: row r's F is the output of token
    ``token[r]`` at kept position ``slot[r]`` (minus ``foil``'s there)."""

    def __init__(self, slot: torch.Tensor, token: torch.Tensor, foil: int | None):
        self.slot, self.token, self.foil = slot, token, foil

    def rows(self, steps: torch.Tensor) -> "StepTargets":
        steps = steps.to(self.slot.device)
        return StepTargets(self.slot.index_select(0, steps), self.token.index_select(0, steps), self.foil)

    def value(self, scorer, logits: torch.Tensor) -> torch.Tensor:
        work = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)  # [b, kept, vocab]
        slot = self.slot.to(work.device) if work.shape[1] > 1 else torch.zeros_like(self.slot, device=work.device)
        rows = work[torch.arange(work.shape[0], device=work.device), slot]  # [b, vocab]
        output = scorer.options.output
        logp = None if output == "logit" else torch.log_softmax(rows, dim=-1)

        def out(tokens):
            idx = tokens.to(work.device).view(-1, 1)
            if output == "logit":
                return rows.gather(1, idx).squeeze(1)
            lp = logp.gather(1, idx).squeeze(1)
            return lp if output == "logprob" else lp.exp()

        v = out(self.token)
        return v if self.foil is None else v - out(torch.full_like(self.token, self.foil))


# -- encoding ----------------------------------------------------------------------------
def encode_steps(scorer, example: Example, prompt: list[int]) -> Encoded:
    """The sequence the model sees and every step's (position, token): the continuation's
    tokens, or ``generate`` tokens made here (greedy, or sampled with the seed + the
    example's index; generation stops after an end-of-sequence token)."""
    opts, tok = scorer.options, scorer.tokenizer
    if scorer.arch.is_encoder_decoder:
        raise OptionError("--generate and --per-step attribute decoder-only language models")
    if opts.continuation is not None:
        gen = scorer.continuation_ids()
    else:
        gen = generate(scorer, prompt, opts.generate, opts.sample_seed, example.index)
    ids = prompt + gen[:-1]
    scorer.check_length(len(ids), example.index)
    if scorer.foil is not None:
        for t, token in enumerate(gen):
            if token == scorer.foil:
                scorer.foil_is_target(example.index, f"step {t}'s token")
    positions = list(range(len(prompt) - 1, len(prompt) - 1 + len(gen)))
    return Encoded(ids, tok.convert_ids_to_tokens(ids), [0] * len(ids), None, False,
                   lm_positions=positions, lm_targets=gen)


def generate(scorer, prompt: list[int], count: int, seed: int | None, index: int) -> list[int]:
    """``count`` tokens after ``prompt``: greedy, or sampled (temperature 1) from a generator
    seeded with ``seed + index``; stops after the tokenizer's end-of-sequence token."""
    limit = scorer.loaded.arch.max_length
    if limit is not None and len(prompt) + count - 1 > limit:
        raise DataError(f"example {index}: {len(prompt)} prompt tokens and {count} generated ones exceed the"
                        f" model's {limit}")
    eos = getattr(scorer.tokenizer, "eos_token_id", None)
    gen_rng = None
    if seed is not None:
        gen_rng = torch.Generator(device="cpu")
        gen_rng.manual_seed(int(seed) + int(index))
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(count):
            kwargs = {"use_cache": False}
            if scorer.takes_logits_to_keep:
                kwargs["logits_to_keep"] = 1
            logits = scorer.model(input_ids=torch.tensor([ids], device=scorer.device), **kwargs).logits[0, -1]
            if gen_rng is None:
                nxt = int(logits.argmax())
            else:
                probs = torch.softmax(logits.double().cpu(), -1)
                nxt = int(torch.multinomial(probs, 1, generator=gen_rng))
            out.append(nxt)
            ids.append(nxt)
            if eos is not None and nxt == eos:
                break
    return out


# -- scoring -------------------------------------------------------------------------------
class StepwiseScorer(Scorer):
    """A Scorer whose examples are generations: encoded by ``encode_steps``, scored by
    ``StepScorer`` (engine/run.py's ``scorer_for`` chooses it for --generate, --per-step)."""

    scores_steps = True

    def _encode_steps(self, example: Example, prompt: list[int]) -> Encoded:
        return encode_steps(self, example, prompt)

    def _score(self, example: Example, enc: Encoded, on_layer=None):
        return StepScorer(self, example, enc).score(on_layer)


class StepScorer:
    """Every step of one encoded generation, sharing the clean forward and the passes."""

    def __init__(self, scorer, example: Example, enc: Encoded):
        self.sc, self.example, self.enc = scorer, example, enc
        self.positions = list(enc.lm_positions)
        self.count = len(self.positions)
        self.tokens = list(enc.lm_targets)
        dev = scorer.device
        self.targets = StepTargets(torch.arange(self.count, device=dev), torch.tensor(self.tokens, device=dev),
                                   scorer.foil)
        self.acc = scorer.acc

    def score(self, on_layer=None):
        sc, enc, count = self.sc, self.enc, self.count
        keep = sc.keep_for(enc)
        fam = sc.families[0]
        sites = [(fam.name, layer) for layer in sc.layers_of[fam.name]]
        with attention.taken_over(sc.model):
            clean, record, logits_g = sc.clean_forward(sites, keep, lambda: sc.logits(enc, 1))  # [1, steps, vocab]
            logits = logits_g.detach()
            f_full = self.targets.value(sc, logits.expand(count, -1, -1)).to("cpu", torch.float64)

            def backward(leaves):  # one backward per step, through the one clean forward
                f_g = self.targets.value(sc, logits_g.expand(count, -1, -1))
                per_step = [torch.autograd.grad(f_g[t], leaves, retain_graph=t < count - 1) for t in range(count)]
                return [torch.cat([per_step[t][i] for t in range(count)]) for i in range(len(leaves))]

            at_one = sc.at_one(sites, clean, record, backward)
            del logits_g
            swept = self._swept(fam.name, clean, at_one, f_full, on_layer)
            # keep sources: each step's kept table [layer, key] is judged as a whole, the layers
            # from the top down, as an example's own (engine/scorer.py)
            floors = [0.0] * count
            done = {}
            for site in (sites[::-1] if keep == "sources" and not swept else sites):
                g, f0, convs, saved = swept[site] if swept else self.integrate(site, clean, at_one.get(site), f_full,
                                                                                floors)
                steps = []
                for t in range(count):
                    n_t = self.positions[t] + 1
                    steps.append(sc.layer_result(g[t:t + 1, :, :n_t], f0[t], float(f_full[t]), keep,
                                                  crop_saved(saved, n_t), convs[t]))
                    if keep == "sources":
                        floors[t] = max(floors[t], float(steps[t]["key_sum"].abs().max()))
                done[site] = steps, sc.layer_result(g.sum(0, keepdim=True), float(np.sum(f0)), float(f_full.sum()),
                                                     keep, saved, _summed_conv(convs))
                if on_layer is not None and not swept:  # (a sweep tells as each layer is done)
                    on_layer(site[1])
                del g
            per_step_layers = [[done[site][0][t] for site in sites] for t in range(count)]
            fams = {fam.name: sc.family_score(fam, keep, record.keep, record.probs, [done[site][1] for site in sites],
                                               len(enc.input_ids))}
        preds = [int(p) for p in logits[0].argmax(-1)]
        result = sc.example_score(self.example, enc, logits, preds[0], -1, self.tokens, float(f_full.sum()), fams)
        step_logits = logits[0].double()
        probs = torch.softmax(step_logits, -1)
        names = sc.tokenizer.convert_ids_to_tokens(self.tokens)
        pred_names = sc.tokenizer.convert_ids_to_tokens(preds)
        result.steps = [StepScore(
            step=t, position=self.positions[t], target=self.tokens[t], target_token=names[t], pred=preds[t],
            f_full=float(f_full[t]), logit=float(step_logits[t, self.tokens[t]]), prob=float(probs[t, self.tokens[t]]),
            family=sc.family_score(fam, keep, None, {}, per_step_layers[t], self.positions[t] + 1),
            foil=sc.foil, extra={"pred_token": pred_names[t]}) for t in range(count)]
        opts = sc.options
        result.meta["lm"].update(per_step=True, generated=opts.generate is not None,
                                 sampled=opts.sample_seed is not None, steps=count)
        return result

    # -- by sweeps ----------------------------------------------------------------------
    def _swept(self, family, clean, at_one, f_full, on_layer=None) -> dict | None:
        """Every layer's passes in sweeps (engine/sweep.py): with ``--tol`` every (layer, step)
        integral refined in one Refinement, each round's nodes of every layer and step in one
        sweep; a fixed rule in one sweep of a row per (layer, node) serving every step. Site ->
        what :meth:`integrate` gives for it; None where sweeps are not used."""
        sc, count = self.sc, self.count
        layers = sc.layers_of[family]
        if not sweep.usable(sc, self.enc, family, layers):
            return None
        kept = count if sc.takes_logits_to_keep else 0
        layer_ids = torch.tensor(layers, dtype=torch.long)
        position = {layer: i for i, layer in enumerate(layers)}
        saved: dict = {}

        def targets(_part, owner):
            rows = self.targets.rows(owner % count)
            return rows, own_position_only(sc.model, rows.slot, kept)

        def shared(u_layer, u_alpha, w):
            """Sweeps of rows at (layer ``u_layer[c]``, ``u_alpha[c]``), each serving every step
            that ``w[:, c]`` weighs, in chunks that fit memory: yields (the chunk's columns, per
            step its w dF/dO or None, F [columns, steps])."""
            def run(part):
                with head_per_position(sc.model, kept) as parts:  # each position's own logits, where it gives them
                    return sweep.shared_pass(sc, self.enc, family, lambda logits: self._values(logits, parts),
                                             clean, u_layer[part], u_alpha[part], w[:, part], saved)

            size = sc.auto_step_batch(self.enc, (family, int(u_layer.min())), len(u_alpha))
            for part, (grads, f) in sc.back_off.chunks(len(u_alpha), size, run, sc.warn):
                sc.last_step_batch = max(sc.last_step_batch, part.stop - part.start)
                yield part, grads, f

        def evaluate(owner, keys, alphas, row_layer, active):
            """The round's (layer, step, node) pairs: one row per (layer, node) serving every step
            where that costs less than a row per pair, each active step of the layer then handed
            every node of those rows (docs/method.md 1.5, item 3); else one row per pair."""
            pairs = list(zip(row_layer.tolist(), keys))
            uniq = sorted(set(pairs))
            if count < 2 or len(uniq) * (1 + count) >= 2 * len(pairs):
                run = sweep.runner(sc, self.enc, family, targets, clean, lambda _owner: row_layer, saved, self.acc)
                return (owner, keys, *rows_of(run, owner, torch.from_numpy(alphas),
                                              torch.ones(len(owner), dtype=self.acc, device=sc.device)))
            u_layer = torch.tensor([u[0] for u in uniq], dtype=torch.long)
            u_alpha = torch.tensor([adaptive.alpha_of(u[1]) for u in uniq], dtype=torch.float64)
            # every active step of each row's layer takes the row (the steps' weights)
            w = torch.zeros((count, len(uniq)), dtype=self.acc, device=sc.device)
            for c, (layer, _key) in enumerate(uniq):
                for t in range(count):
                    if position[layer] * count + t in active:
                        w[t, c] = 1
            own, ks, gs, fs = [], [], [], []
            for part, grads, f in shared(u_layer, u_alpha, w):
                for t in range(count):
                    if grads[t] is None:
                        continue
                    cols = torch.nonzero(w[t, part] > 0).flatten()
                    for c in cols.tolist():
                        layer, key = uniq[part.start + c]
                        own.append(position[layer] * count + t)
                        ks.append(key)
                    gs.append(grads[t].index_select(0, cols.to(grads[t].device)).to(self.acc))
                    fs.append(f[cols.to(f.device), t])
            return torch.tensor(own, dtype=torch.long), ks, torch.cat(gs), torch.cat(fs)

        try:
            sweep.same_shapes(at_one, family, layers)
            ones = [at_one.get((family, layer)) for layer in layers]
            known = None if any(x is None for x in ones) else torch.cat(ones)
            if sc.options.tol is None:  # one row per (layer, node) serves every step
                def own(i):
                    n = self.positions[i % count] + 1
                    return n, crop_saved(saved[layers[i // count]], n)

                run = lambda o, a, w: self._by_node(o, a, w, lambda key, *x: shared(layer_ids[key], *x))  # noqa: E731
                g, f0, convs = fixed(sc, len(layers) * count, run, known, self.acc, own)
                for layer in layers if on_layer is not None else []:
                    on_layer(layer)
            else:
                g, f0, convs = sweep.refine(sc, self.enc, family, layers, count, clean, known, f_full.numpy(),
                                            targets, saved, self.acc, evaluate=evaluate, on_layer=on_layer)
        except attention.NotSweepable:
            sc.sweeps_work = False  # this model: one pass per target layer from now on
            return None
        return {(family, layer): (g[i * count:(i + 1) * count], f0[i * count:(i + 1) * count],
                                  convs[i * count:(i + 1) * count], saved[layer]) for i, layer in enumerate(layers)}

    # -- rows of several steps ---------------------------------------------------------
    def _values(self, logits, parts=()):
        """F of every step on every row, [rows, steps] (``parts``: each position's own logits,
        where head_per_position gives them)."""
        own = parts if len(parts) == self.count else [logits[:, t:t + 1] for t in range(self.count)]
        return torch.stack([self.targets.rows(torch.full((len(logits),), t)).value(self.sc, own[t])
                            for t in range(self.count)], dim=1)

    def _by_node(self, owner, alphas, weights, shared):
        """Rows of integrals (key, step) = divmod(``owner``, steps), where one row per (key,
        alpha) serves every step that wants it: ``shared(u_key, u_alpha, w)`` yields (the
        columns run, per step its w dF/dO of them or None, F [columns, steps]) of the columns
        (``u_key``, ``u_alpha``) and the steps' weights ``w`` [steps, columns]. Yields (rows,
        w_r dF/dO_r or None, F_r)."""
        count = self.count
        pairs = list(zip((owner // count).tolist(), [float(a) for a in alphas]))
        uniq = {p: c for c, p in enumerate(sorted(set(pairs)))}
        col, step = torch.tensor([uniq[p] for p in pairs]), owner % count
        w = torch.zeros((count, len(uniq)), dtype=self.acc, device=self.sc.device)
        if weights is not None:
            w[step.to(w.device), col.to(w.device)] = weights.to(w)
        u_alpha = torch.tensor([p[1] for p in uniq], dtype=torch.float64)
        for part, grads, f in shared(torch.tensor([p[0] for p in uniq], dtype=torch.long), u_alpha, w):
            for t in range(count):
                rows = torch.nonzero((step == t) & (col >= part.start) & (col < part.stop)).flatten()
                if not len(rows):
                    continue
                local = col[rows] - part.start
                g = None if grads[t] is None else grads[t].index_select(0, local.to(grads[t].device)).to(self.acc)
                yield rows, g, f[local.to(f.device), t]

    def _run(self, site, clean, owner, alphas, weights, box: dict):
        """Passes over rows (step ``owner[r]`` at ``alphas[r]``, weight ``weights[r]``): yields
        (rows, w_r dF_r/dO_r, F_r); the saved projections go to ``box``. Where the steps want
        (nearly) the same nodes, one forward per node serves every step (:meth:`_shared`), else
        rows of several steps share passes."""
        alist = [float(a) for a in alphas]
        uniq = len(set(alist))
        if self.count > 1 and len(set(zip(owner.tolist(), alist))) == len(alist):
            if uniq * self.count <= SHARED_SLACK * len(alist):
                return self._shared(site, clean, owner, alphas, weights, box)
            if uniq < len(alist) and len(self.enc.input_ids) >= LONG_SHARED:
                return self._shared(site, clean, owner, alphas, weights, box, one_node=True)
        return self._rows(site, clean, owner, alphas, weights, box)

    def _shared(self, site, clean, owner, alphas, weights, box: dict, one_node: bool = False):
        """One forward per node for every step (the same forward; only F differs: docs/method.md
        1.5), then one backward per step through it. ``one_node``: one node per forward,
        and a backward only for the steps that want it (U forwards and R backwards for R rows at
        U nodes, where rows would cost R of each; a backward through a pass of several nodes
        costs all of them, wanted or not)."""
        sc, enc = self.sc, self.enc

        def shared(_key, u_alpha, w):
            def run(part):
                k = part.stop - part.start
                plan = attention.Attribute(site[1], u_alpha[part].to(sc.device), sc.backend, family=site[0])
                with sc.sites.target_pass(site, clean, plan), torch.enable_grad():
                    f = self._values(sc.logits(enc, k, sc.sites.extra_inputs(site, clean, k)))  # [k, steps]
                    if plan.leaf is None:
                        raise attention.not_routed(sc.arch.model_type, *site)
                    grads = sweep.per_target(f, w[:, part], [plan.leaf])
                return grads, f.detach(), plan.saved

            size = 1 if one_node else sc.auto_step_batch(enc, site, len(u_alpha))
            for part, (grads, f, saved) in sc.back_off.chunks(len(u_alpha), size, run, sc.warn):
                sc.last_step_batch = max(sc.last_step_batch, part.stop - part.start)
                box.setdefault("saved", saved)
                yield part, grads, f

        return self._by_node(owner, alphas, weights, shared)

    def _rows(self, site, clean, owner, alphas, weights, box: dict):
        sc = self.sc

        def targets(part):
            rows = self.targets.rows(owner[part])
            return rows, own_position_only(sc.model, rows.slot, self.count if sc.takes_logits_to_keep else 0)

        for part, g, f, saved in sc.passes(self.enc, site, targets, clean, alphas, weights):
            box.setdefault("saved", saved)
            yield part, g, f

    def integrate(self, site, clean, grad_at_one, f_full, floors=None):
        """Every step's integral of ``site`` (engine/layer_integral.py's ``integrate``): (G [steps,
        ...], F(0), (nodes, error estimate, cap hit[, state]) per step, the saved projections);
        ``floors``: the least scale each step's is judged against with ``--tol``."""
        box: dict = {}

        def zero():  # every step from one forward
            alpha = torch.zeros(1, dtype=torch.float64)
            ((_part, _g, f, saved),) = self.sc.passes(self.enc, site, one_target(self.targets), clean, alpha, None)
            box.setdefault("saved", saved)
            return f.to("cpu", torch.float64).tolist()

        def own(t):
            return self.positions[t] + 1, crop_saved(box["saved"], self.positions[t] + 1)

        run = lambda o, a, w: self._run(site, clean, torch.as_tensor(o), a, w, box)  # noqa: E731
        g, f0, convs = integrate(self.sc, self.count, run, grad_at_one, f_full, self.acc,
                                 Maps(self.sc.judged, lambda _k: box["saved"]), own, floors, zero)
        if "saved" not in box:  # every node was known (cannot happen: alpha = 0 is always evaluated)
            zero()
        return g, f0, convs, box["saved"]


@contextlib.contextmanager
def head_per_position(model, kept: int):
    """Inside, the LM head runs each of the ``kept`` positions as its own product and yields
    the list of their logits ([rows, 1, vocab] each; empty where the head is not the output
    embeddings' module or its input has another shape). The model's logits are the same
    numbers; an F read from position i's own logits (one step of a shared row,
    sweep.shared_pass) has a backward through that position's product only, not through the
    whole head (a small LM's largest matrix: SmolLM2's 576 x 49152)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    parts: list = []
    if head is None or kept < 2:
        yield parts
        return
    original = head.forward

    def forward(h, *args, **kwargs):
        if not torch.is_tensor(h) or h.dim() != 3 or h.shape[1] != kept:
            return original(h, *args, **kwargs)
        parts[:] = [original(h[:, i:i + 1].contiguous(), *args, **kwargs) for i in range(kept)]
        with torch.no_grad():  # what the model returns; F reads ``parts``
            return torch.cat(parts, 1)

    with attention.patched_forwards([(head, forward)]):
        yield parts


@contextlib.contextmanager
def own_position_only(model, slot: torch.Tensor, kept: int):
    """Inside, the LM head reads each row's own position only: its input [rows, kept, d] is cut
    to [rows, 1, d] at ``slot[r]`` (StepTargets.value then reads position 0). A row's F reads
    that one position, so nothing changes but the head's work (kept times less). Left as it is
    where the head is not the output embeddings' module or its input has another shape."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or kept < 2:
        yield
        return

    def pre(_module, args):
        h = args[0] if args else None
        if not torch.is_tensor(h) or h.dim() != 3 or h.shape[1] != kept or h.shape[0] != len(slot):
            return None
        return (h[torch.arange(h.shape[0], device=h.device), slot.to(h.device)].unsqueeze(1), *args[1:])

    handle = head.register_forward_pre_hook(pre)
    try:
        yield
    finally:
        handle.remove()


def _summed_conv(convs: list) -> tuple:
    """The summed map's (nodes, error, cap hit, state): the most nodes of a step, the largest
    estimate, any cap hit, and the first unconverged step's state (converged when all are)."""
    nodes, errors, capped = max(c[0] for c in convs), [c[1] for c in convs], any(c[2] for c in convs)
    if any(len(c) == 3 for c in convs):  # fixed rules: judged by the assembly from the summed map
        return nodes, float(np.nanmax(errors)) if np.isfinite(errors).any() else float("nan"), capped
    bad = [c[3] for c in convs if c[3] != adaptive.CONVERGED]
    return nodes, float(max(errors)), capped, bad[0] if bad else adaptive.CONVERGED
