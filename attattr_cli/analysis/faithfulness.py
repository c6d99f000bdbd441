"""Is it an explanation? Faithfulness tests of token importance: agreement with leave-one-out
(Kendall tau-b), ERASER erasure (comprehensiveness, sufficiency, AOPC over the bins),
deletion curves, DecompX's masking protocol with normalised AOPC, and Jain & Wallace's
attention permutation test (median TVD per layer). Definitions, bins and conventions:
docs/faithfulness.md, "The metrics" and "Words"; docs/method.md section 5.

Conventions the code relies on: only content tokens (segment id >= 0) are ranked and erased,
ties break by position; a bin of fraction q of m units holds k = max(1, ceil(q m)); t is the
store's target class; TVD = 0.5 sum_c |p_c - p'_c|. With ``aggregate="words"`` the units are
words (:class:`Units`). Pure functions first; :func:`evaluate_store` runs them over a store.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..fileio import strict_json
from ..errors import OptionError, StoreError
from .methods import REGISTRY
from .stats import kendall_tau_b
from .token_importance import (
    ALL_METHODS,
    MAX_TOKENS,
    METHODS,
    ModelRunner,
    Prepared,
    check_methods,
    expand_methods,
    model_inputs,
    params_for,
    pool_position,
)

BINS = (0.01, 0.05, 0.10, 0.20, 0.50)
DELETION_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(11))
MASK_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 10))
Progress = Callable[[int, int, str], None]
#: examples whose forward passes are run together (see :func:`evaluate_store`)
BATCH_EXAMPLES = 16


# -- erasure ------------------------------------------------------------------------------

def ranking(scores: np.ndarray, content: np.ndarray) -> np.ndarray:
    """Content positions from most to least important (ties: earlier position first)."""
    s = np.asarray(scores, dtype=np.float64)[content]
    order = np.lexsort((content, -s))
    return np.asarray(content)[order]


def bin_size(q: float, m: int) -> int:
    """Tokens in an ERASER bin of fraction q of m content tokens: max(1, ceil(q m))."""
    return min(m, max(1, math.ceil(q * m - 1e-9)))


def erasure_keeps(n: int, content: np.ndarray, scores: dict[str, np.ndarray], bins: Sequence[float] = BINS,
                  fractions: Sequence[float] = DELETION_FRACTIONS) -> tuple[list[np.ndarray], dict]:
    """The keep-masks :func:`erasure_metrics` evaluates (the full input first) and where
    each method's bins and curve points are among them."""
    content = np.asarray(content)
    m = len(content)
    keeps: list[np.ndarray] = [np.ones(n, dtype=bool)]
    slots: dict[str, dict[str, list[int]]] = {}
    for name, sc in scores.items():
        order = ranking(sc, content)
        slot = slots[name] = {"comp": [], "suff": [], "del": []}
        # comprehensiveness erases a bin's top tokens, sufficiency keeps only them (and the special tokens)
        wanted = [(part, _keep(n, order[:k]) if part == "comp" else _keep(n, content, order[:k]))
                  for k in (bin_size(q, m) for q in bins) for part in ("comp", "suff")]
        wanted += [("del", _keep(n, order[:int(round(f * m))])) for f in fractions]
        for part, keep in wanted:
            slot[part].append(len(keeps))
            keeps.append(keep)
    return keeps, slots


def _keep(n: int, erased: np.ndarray, kept: np.ndarray | None = None) -> np.ndarray:
    """A keep-mask of n tokens: False at ``erased``, then True again at ``kept``."""
    keep = np.ones(n, dtype=bool)
    keep[erased] = False
    if kept is not None:
        keep[kept] = True
    return keep


def erasure_metrics(predict: Callable[[list[np.ndarray]], np.ndarray], n: int, content: np.ndarray,
                    scores: dict[str, np.ndarray], bins: Sequence[float] = BINS,
                    fractions: Sequence[float] = DELETION_FRACTIONS) -> dict[str, dict]:
    """Comprehensiveness, sufficiency (per bin and AOPC) and the deletion curve of each
    method for one example.

    ``predict(keeps)``: the target class probability for each keep-mask (bool [n]; False
    = erased). All masks of all methods are handed over in one call.
    """
    keeps, slots = erasure_keeps(n, content, scores, bins, fractions)
    p = np.asarray(predict(keeps), dtype=np.float64)
    p0 = p[0]
    out = {}
    for name, slot in slots.items():
        comp = [p0 - p[i] for i in slot["comp"]]
        suff = [p0 - p[i] for i in slot["suff"]]
        curve = [p[i] for i in slot["del"]]
        out[name] = {
            "comprehensiveness": float(np.mean(comp)),
            "sufficiency": float(np.mean(suff)),
            "comprehensiveness_bins": [float(c) for c in comp],
            "sufficiency_bins": [float(s) for s in suff],
            "deletion_curve": [float(c) for c in curve],
            "deletion_auc": float(np.trapezoid(curve, fractions)) if len(fractions) > 1 else float("nan"),
        }
    return out


# -- masking (DecompX's protocol) ---------------------------------------------------------

def mask_keeps(n: int, content: np.ndarray, scores: dict[str, np.ndarray], bounds: np.ndarray | None = None,
               fractions: Sequence[float] = MASK_FRACTIONS) -> tuple[list[np.ndarray], dict[str, list[int]]]:
    """The keep-masks :func:`mask_metrics` evaluates (the full input first) and where each
    order's fractions are among them."""
    content = np.asarray(content)
    orders = {name: ranking(sc, content) for name, sc in scores.items()}
    if bounds is not None:
        orders["\0hi"] = ranking(bounds, content)
        orders["\0lo"] = ranking(-np.asarray(bounds, dtype=np.float64), content)
    keeps = [np.ones(n, dtype=bool)]
    slots: dict[str, list[int]] = {}
    for name, order in orders.items():
        slots[name] = list(range(len(keeps), len(keeps) + len(fractions)))
        keeps += [_keep(n, order[:bin_size(q, len(content))]) for q in fractions]
    return keeps, slots


def mask_metrics(predict: Callable[[list[np.ndarray]], np.ndarray], n: int, content: np.ndarray,
                 scores: dict[str, np.ndarray], target: int, label: int, bounds: np.ndarray | None = None,
                 fractions: Sequence[float] = MASK_FRACTIONS) -> dict[str, dict]:
    """AOPC and accuracy after masking the top K % of the content tokens, per method, for
    one example; the normalised AOPC between the best (hi) and worst (lo) AOPC of the orders
    at hand (every method's, and with ``bounds``, e.g. LOO, that order and its reverse).

    ``predict(keeps)``: class probabilities [len(keeps), C] with the positions where a keep
    mask is False replaced by the mask token.
    """
    keeps, slots = mask_keeps(n, content, scores, bounds, fractions)
    p = np.asarray(predict(keeps), dtype=np.float64)
    p0 = p[0, target]
    aopc = {name: float(np.mean([p0 - p[i, target] for i in idx])) for name, idx in slots.items()}
    hi, lo = max(aopc.values()), min(aopc.values())
    out = {}
    for name in scores:
        idx = slots[name]
        norm = None
        if hi - lo >= 1e-6:
            norm = (aopc[name] - lo) / (hi - lo)
        out[name] = {
            "aopc": aopc[name],
            "aopc_bins": [float(p0 - p[i, target]) for i in idx],
            "accuracy": float(np.mean([int(np.argmax(p[i])) == int(label) for i in idx])),
            "accuracy_bins": [float(int(np.argmax(p[i])) == int(label)) for i in idx],
            "kept": float(np.mean([int(np.argmax(p[i])) == int(target) for i in idx])),
            "naopc": norm,
        }
    return out


# -- permutation --------------------------------------------------------------------------

def permutation_index(permutations: int, heads: int, n: int, causal: bool, generator: torch.Generator) -> torch.Tensor:
    """[permutations, heads, n, n] indices: every row a random permutation of the keys it
    may attend to (all keys; j <= i for causal attention), the others left in place."""
    r = torch.rand(permutations, heads, n, n, generator=generator, dtype=torch.float64)
    if causal:
        j = torch.arange(n, dtype=torch.float64)
        future = j[None, :] > j[:, None]
        r = torch.where(future, 2.0 + j.expand(n, n), r)
    # NumPy's sort, a few times quicker than torch's here; the keys are distinct (ties of
    # random doubles aside), so the order is the one torch's argsort gives
    return torch.from_numpy(np.argsort(r.numpy(), -1))


def total_variation(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(-1)


def permutation_tvd(runner: ModelRunner, ex: Prepared, layers: Sequence[int], permutations: int,
                    seed: int = 0) -> np.ndarray:
    """TVD between the output distribution and the distribution with layer l's attention
    permuted, [len(layers), permutations]."""
    return permutation_tvds(runner, [ex], layers, permutations, seed)[0]


def permutation_tvds(runner: ModelRunner, examples: Sequence[Prepared], layers: Sequence[int], permutations: int,
                     seed: int = 0) -> list[np.ndarray]:
    """:func:`permutation_tvd` of several examples: the permuted inputs of the examples of
    one length share passes (at most ``runner.max_tokens`` tokens each); every example's
    permutations are drawn from its own seeded generator, as alone."""
    from ..engine import attention

    model = runner.model
    loaded = runner.loaded
    dev = runner.device
    outs = [np.zeros((len(layers), permutations)) for _ in examples]
    index = []  # [example][layer]: [permutations, heads, n, n]
    for ex in examples:
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(ex.index))
        index.append([permutation_index(permutations, loaded.arch.num_heads, ex.n, loaded.arch.is_decoder, gen)
                      for _ in layers])
    bases = [runner.probabilities(ex, [np.ones(ex.n, dtype=bool)])[0] for ex in examples]  # the clean inputs
    by_shape: dict[tuple, list[int]] = {}
    for e, ex in enumerate(examples):
        by_shape.setdefault((ex.n, ex.token_type_ids is None), []).append(e)
    with attention.taken_over(model) as stack, torch.no_grad(), \
            attention.first_token_only(attention.first_token_output(model, stack)):
        for (n, _), members in by_shape.items():
            per = max(1, runner.max_tokens // max(n, 1))
            base = model_inputs([examples[e] for e in members], dev)
            rows = [(k, p) for k in range(len(members)) for p in range(permutations)]  # (member, permutation)
            for li, layer in enumerate(layers):
                for start in range(0, len(rows), per):
                    part = rows[start:start + per]
                    who = torch.tensor([k for k, _ in part], device=dev)
                    idx = torch.stack([index[members[k]][li][p] for k, p in part])
                    with attention.active(attention.Permute(layer, idx.to(dev))):
                        logits = model(**{k: v[who] for k, v in base.items()}).logits.double()
                    runner.forwards += len(part)
                    probs = torch.softmax(logits, -1).cpu().numpy()
                    for (k, p), row in zip(part, probs):
                        outs[members[k]][li, p] = total_variation(row, bases[members[k]])
    return outs


# -- over a store ------------------------------------------------------------------------

@dataclass
class FaithfulnessOptions:
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    examples: str | list[int] | None = None  # data indices (a spec such as 0:200, or a list); None: all
    bins: tuple = BINS
    fractions: tuple = DELETION_FRACTIONS
    permutations: int = 20
    perm_layers: list[int] | None = None  # None: every layer; []: no permutation test
    erase: str = "remove"
    seed: int = 0
    mask_fractions: tuple = MASK_FRACTIONS  # (): no masking protocol
    adversarial: object | None = None  # adversarial.AdversarialOptions: run the adversarial-attention experiment
    aggregate: str | None = None  # "words": rank, erase and compare words (see :class:`Units`); None/"tokens": tokens

    def validate(self) -> None:
        from .aggregate import words_asked

        self.methods = check_methods(self.methods)
        words_asked(self.aggregate)
        for q in self.mask_fractions:
            if not 0 < q < 1:
                raise OptionError(f"mask fractions are in (0, 1), got {q}")
        if self.adversarial is not None:
            self.adversarial.validate()
        if self.permutations < 0:
            raise OptionError(f"--permutations must be 0 or more, got {self.permutations}")
        for q in self.bins:
            if not 0 < q <= 1:
                raise OptionError(f"bins are fractions in (0, 1], got {q}")


@dataclass
class Units:
    """What the metrics rank and erase in one example: its tokens, or with ``aggregate
    "words"`` its words (a word's score is the sum of its tokens'; a word is content when all
    its tokens are; erasing a word erases all its tokens: docs/faithfulness.md, "Words")."""

    n: int
    content: np.ndarray
    groups: list | None = None  # None: the tokens themselves
    tokens: int = 0

    @classmethod
    def of(cls, stored, ex: Prepared, words: bool) -> "Units":
        if not words:
            return cls(ex.n, ex.content, None, ex.n)
        from .aggregate import word_groups

        groups = word_groups([str(t) for t in stored.tokens][:ex.n])
        content = set(np.asarray(ex.content).tolist())
        kept = [g for g, idx in enumerate(groups) if all(i in content for i in idx)]
        return cls(len(groups), np.asarray(kept, dtype=np.int64), groups, ex.n)

    def scores(self, scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each method's scores over the units (summed over a word's tokens)."""
        if self.groups is None:
            return scores
        from .aggregate import membership

        p = membership(self.groups, self.tokens)
        return {m: p @ np.asarray(v, dtype=np.float64) for m, v in scores.items()}

    def keeps(self, keeps: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Keep-masks over the units as keep-masks over the tokens."""
        if self.groups is None:
            return list(keeps)
        from .aggregate import token_keep

        return [token_keep(k, self.groups, self.tokens) for k in keeps]


def _summary(metric: str, rows, m: str, parts: int) -> dict:
    """``metric``'s mean over the examples where it is finite, then (the first ``parts`` of)
    ``<metric>_se`` (None with one example) and ``<metric>_n``."""
    v = np.asarray([x for x in _values(rows, metric, m) if x is not None], dtype=np.float64)
    n = len(v)
    mean = float(v.mean()) if n else None
    se = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else None
    return dict(list(zip((metric, f"{metric}_se", f"{metric}_n"), (mean, se, n)))[:parts])


def load_for_store(store, model: str | None = None, device: str = "auto"):
    """Load the model a store was made with (or ``model``), and check its weights."""
    from ..models.default import DEFAULT_MODEL_DIR
    from ..models.loading import load

    prov = store.provenance
    fp = store.fingerprint
    dtype = (prov.get("options") or {}).get("dtype", "float32")
    model_id = model
    if model_id is None:
        if prov.get("model_source") == "builtin":
            model_id = str(DEFAULT_MODEL_DIR)
        else:
            model_id = str(prov.get("model_path") or prov.get("model") or "")
            if not model_id or (prov.get("model_source") == "local" and not Path(model_id).exists()):
                raise StoreError(f"{store.path} was made with the model {model_id or '?'}, which is not here: pass --model")
    loaded = load(model_id, device=device, dtype=dtype)
    want = fp.get("weights_sha256") or prov.get("weights_sha256")
    if want and loaded.weights_sha256 != want:
        raise StoreError(
            f"{store.path} was made with another model (weights sha256 {str(want)[:12]}…; "
            f"--model {model_id}: {loaded.weights_sha256[:12]}…)"
        )
    return loaded


def _prepare(loaded, stored, is_decoder: bool) -> Prepared:
    from ..data.types import Example
    from ..engine.encoding import encode

    stored_ids = [int(i) for i in stored.input_ids]
    enc = encode(loaded.tokenizer, Example(stored.index, stored.text_a, stored.text_b),
                 len(stored_ids) if stored.truncated else None, truncate=True, tokens=False,
                 token_types=loaded.arch.token_types)
    ids = enc.input_ids
    if ids[:len(stored_ids)] != stored_ids:
        raise StoreError(
            f"example {stored.index}: the tokenizer of this model does not give the stored tokens; "
            "was the store made with another tokenizer?"
        )
    tt = None
    if enc.token_type_ids is not None:
        tt = np.asarray(enc.token_type_ids[:len(stored_ids)], dtype=np.int64)
    n = len(stored_ids)
    return Prepared(stored.index, np.asarray(stored_ids, dtype=np.int64), tt, np.asarray(stored.segment_ids),
                    int(stored.target), pool_position(n, is_decoder))


def evaluate_store(path: str | Path, options: FaithfulnessOptions, model: str | None = None,
                   device: str = "auto", loaded=None, progress: Progress | None = None,
                   batch_examples: int = BATCH_EXAMPLES, max_tokens: int = MAX_TOKENS, keep: bool = False) -> dict:
    """Compute (or read) every method's token importance for the store's examples and return
    the faithfulness report (a JSON-able dict). The store is opened read-only and left as it
    is, unless ``keep``: then the vectors computed are added to it (the next run reads them).

    ``batch_examples`` examples at a time share their forward passes: the leave-one-out
    inputs of all of them and their gradients, then every erased and masked input of all
    of them, then their permuted inputs, grouped by length (``max_tokens`` tokens per pass
    at most; no padding); 0: each metric of each example runs its own passes.
    ``max_tokens`` 1: one sequence per pass. The numbers are the same up to the float
    rounding of batches of other sizes (tests/test_faithfulness.py)."""
    from ..data import parse_examples
    from ..store import TokenImportanceStore
    from .adversarial import adversarial_example, summarise
    from .aggregate import words_asked
    from .methods.ig import summary

    options.validate()
    with TokenImportanceStore(path, writable=keep) as store:
        prov = store.provenance
        score_opts = prov.get("options") or {}
        output = score_opts.get("output", "prob")
        if score_opts.get("lm") or (loaded is not None and loaded.lm):
            what = ("a language model's generation, step by step" if score_opts.get("generate") or score_opts.get("per_step")
                    else "a language model's next-token scores")
            raise OptionError(f"{store.path} holds {what} (scored with --lm): faithfulness erases tokens of a"
                              " classifier's input and reads its class, and does not evaluate language-model stores")
        if loaded is None:
            loaded = load_for_store(store, model, device)
        runner = ModelRunner(loaded, output=output, erase=options.erase, max_tokens=max_tokens)
        options.methods, left_out = expand_methods(options.methods, loaded)
        masking = bool(options.mask_fractions) and runner.mask_id is not None
        if options.mask_fractions and not masking:
            left_out.append("masking protocol left out: the tokenizer has no mask token")
        have = store.indices()
        if not have:
            raise StoreError(f"{store.path} holds no examples")
        if options.examples is None:
            chosen = have
        elif not isinstance(options.examples, str):
            chosen = [int(i) for i in options.examples]
        else:
            chosen = parse_examples(options.examples, have[-1] + 1)
        chosen, skipped = store.finite(chosen)
        if not chosen:
            raise StoreError(f"every example asked for in {store.path} holds NaN or inf (flagged 'nonfinite')")
        unconverged = len(store.unconverged(chosen))
        num_layers = loaded.arch.num_layers
        for x in options.perm_layers or []:
            if not -num_layers <= x < num_layers:
                raise OptionError(f"layer {x} does not exist: the model has {num_layers} layers (0..{num_layers - 1})")
        perm_layers = list(range(num_layers)) if options.perm_layers is None else sorted(
            {x % num_layers for x in options.perm_layers})
        params = {m: params_for(m, output, options.erase, options.seed, score_opts)
                  for m in dict.fromkeys([*options.methods, "loo", "grad"])}
        words = words_asked(options.aggregate)
        per_example = []
        adversarial_rows = []
        total = len(chosen)
        if progress:
            progress(0, total, "")
        group = max(1, int(batch_examples))
        with runner.caching() if batch_examples else contextlib.nullcontext():
            for start in range(0, total, group):
                items = []
                for index in chosen[start:start + group]:
                    stored = store.get(index)
                    ex = _prepare(loaded, stored, loaded.arch.is_decoder)
                    held = {m: store.stored(index, m, p) for m, p in params.items()}
                    scores = {m: np.asarray(v, dtype=np.float64) for m, v in held.items() if v is not None}
                    items.append((index, stored, ex, scores, [m for m in params if m not in scores]))
                if batch_examples:  # the leave-one-out inputs and the gradients of the group's examples together
                    runner.prefetch((ex, runner.loo_keeps(ex), None) for _, _, ex, _, todo in items if "loo" in todo)
                    runner.prefetch_gradients([ex for _, _, ex, _, todo in items
                                               if any("gradients" in REGISTRY[m].needs for m in todo)])
                for index, stored, ex, scores, todo in items:
                    if todo:
                        fresh = runner.compute(ex, todo, attribution=stored.attribution, seed=options.seed)
                        for m, v in fresh.items():
                            store.write(index, m, v, params[m], ALL_METHODS[m])
                            scores[m] = np.asarray(v, dtype=np.float32).astype(np.float64)
                runner.clear()  # the metrics' passes the same whether or not LOO ran
                units = [Units.of(stored, ex, words) for _, stored, ex, _, _ in items]
                if batch_examples:  # every erased and masked input of the group's examples together
                    wanted = []
                    for (_, _stored, ex, scores, _), u in zip(items, units):
                        ranked = u.scores({m: scores[m] for m in options.methods})
                        wanted.append((ex, u.keeps(erasure_keeps(u.n, u.content, ranked, options.bins,
                                                                 options.fractions)[0]), None))
                        if masking:
                            wanted.append((ex, u.keeps(mask_keeps(u.n, u.content, ranked, u.scores(scores)["loo"],
                                                                  options.mask_fractions)[0]), "mask"))
                    runner.prefetch(wanted)
                if options.permutations and perm_layers:  # batch_examples 0: a group of one, as alone
                    tvds = permutation_tvds(runner, [it[2] for it in items], perm_layers, options.permutations,
                                            options.seed)
                for k, ((index, stored, ex, scores, _), u) in enumerate(zip(items, units)):
                    content = u.content
                    scores = u.scores(scores)
                    ranked = {m: scores[m] for m in options.methods}
                    c = {m: v[content] for m, v in scores.items()}
                    row: dict = {"index": int(index), "n_tokens": int(ex.n), "n_content": int(len(content)),
                                 "target": int(ex.target),
                                 "tau_loo": {m: kendall_tau_b(c[m], c["loo"]) for m in options.methods},
                                 "tau_loo_abs": {m: kendall_tau_b(np.abs(c[m]), np.abs(c["loo"]))
                                                 for m in options.methods},
                                 "tau_grad": {m: kendall_tau_b(c[m], c["grad"]) for m in options.methods}}
                    if words:  # n_content counts content words
                        row["n_words"] = int(u.n)
                    row["erasure"] = erasure_metrics(lambda keeps: runner.target_probability(ex, u.keeps(keeps)), u.n,
                                                     content, ranked, options.bins, options.fractions)
                    if masking:
                        label = int(stored.gold) if int(stored.gold) >= 0 else int(ex.target)
                        row["label"], row["label_is_gold"] = label, int(stored.gold) >= 0
                        row["masking"] = mask_metrics(lambda keeps: runner.probabilities(ex, u.keeps(keeps), erase="mask"),
                                                      u.n, content, ranked, int(ex.target), label, bounds=scores["loo"],
                                                      fractions=options.mask_fractions)
                    if options.adversarial is not None:
                        adversarial_rows.append(adversarial_example(runner, ex, options.adversarial))
                    if options.permutations and perm_layers:
                        row["permutation_median_tvd"] = [float(v) for v in np.median(tvds[k], axis=1)]
                    per_example.append(row)
                    if progress:
                        progress(start + k + 1, total, f"example {index}")
                runner.clear()
    report = _report(str(path), prov, options, perm_layers, per_example, runner.forwards, skipped)
    report["unconverged"] = int(unconverged)  # examples used with a layer whose integral did not converge
    report["left_out"] = left_out
    if "ig" in runner.notes:
        report["completeness"] = {"ig": summary(runner.notes["ig"])}  # examples whose IG ran now (not from the store)
    if options.adversarial is not None:
        a = options.adversarial
        report["adversarial"] = strict_json({
            "layer": adversarial_rows[0]["layer"] if adversarial_rows else None,
            "settings": _settings(a),
            "summary": summarise(adversarial_rows, a.epsilons, options.seed),
            "per_example": adversarial_rows,
        })
        report["settings"]["adversarial"] = report["adversarial"]["settings"]
    return report


def _report(path, prov, options, perm_layers, rows, forwards, skipped: int = 0) -> dict:
    methods = {}
    masked = [r for r in rows if "masking" in r]
    for m in options.methods:
        entry = methods[m] = {"description": ALL_METHODS[m]}
        for metric, parts in (("tau_loo", 3), ("tau_loo_abs", 2), ("tau_grad", 3), ("comprehensiveness", 2),
                              ("sufficiency", 2)):
            entry.update(_summary(metric, rows, m, parts))
        for key in ("comprehensiveness_bins", "sufficiency_bins", "deletion_curve"):
            entry[key] = np.mean([r["erasure"][m][key] for r in rows], 0).tolist()
        entry.update(_summary("deletion_auc", rows, m, 1))
        if masked:
            for key in ("aopc", "naopc", "accuracy", "kept"):
                entry.update(_summary(f"mask_{key}", masked, m, 3 if key == "naopc" else 2))
            for key in ("aopc_bins", "accuracy_bins"):
                entry[f"mask_{key}"] = np.mean([r["masking"][m][key] for r in masked], 0).tolist()
    _intervals(methods, rows, options.seed)
    t = np.asarray([r["permutation_median_tvd"] for r in rows if "permutation_median_tvd" in r])  # [examples, layers]
    perm = {
        "layers": list(perm_layers),
        "permutations": options.permutations,
        "median_tvd_mean": t.mean(0).tolist(),
        "median_tvd_median": np.median(t, 0).tolist(),
        "share_below_0.05": (t < 0.05).mean(0).tolist(),
    } if len(t) else None
    score_opts = prov.get("options") or {}
    return strict_json({
        "store": path,
        "model": prov.get("model"),
        "task": prov.get("task"),
        "target": score_opts.get("target"),
        "output": score_opts.get("output"),
        "attribution_steps": score_opts.get("steps"),
        "examples": len(rows),
        "skipped_nonfinite": int(skipped),
        "settings": _settings(options),
        "accuracy": _accuracy(rows),
        "forwards": int(forwards),
        "methods": methods,
        "permutation": perm,
        "paired_tests": paired_tests(rows, options.methods, options.seed),
        "per_example": rows,
    })


def _settings(options) -> dict:
    """The fields of an options dataclass as JSON values (tuples as lists), the adversarial options left out."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items() if k != "adversarial"}


def _accuracy(rows) -> dict | None:
    """Accuracy on the unmasked inputs (the target is the predicted class by default)."""
    with_gold = [r for r in rows if r.get("label_is_gold")]
    if not with_gold:
        return None
    return {"examples": len(with_gold), "accuracy": float(np.mean([r["target"] == r["label"] for r in with_gold]))}


#: per-example metrics: where they are in a per-example row, and which direction is better
METRICS = {
    "tau_loo": (lambda r, m: r["tau_loo"][m], "greater"),
    "tau_loo_abs": (lambda r, m: r["tau_loo_abs"][m], "greater"),
    "tau_grad": (lambda r, m: r["tau_grad"][m], "greater"),
    "comprehensiveness": (lambda r, m: r["erasure"][m]["comprehensiveness"], "greater"),
    "sufficiency": (lambda r, m: r["erasure"][m]["sufficiency"], "less"),
    "deletion_auc": (lambda r, m: r["erasure"][m]["deletion_auc"], "less"),
    "mask_aopc": (lambda r, m: r["masking"][m]["aopc"], "greater"),
    "mask_naopc": (lambda r, m: r["masking"][m]["naopc"], "greater"),
    "mask_accuracy": (lambda r, m: r["masking"][m]["accuracy"], "less"),
    "mask_kept": (lambda r, m: r["masking"][m]["kept"], "less"),
}


def _values(rows, metric, m) -> list[float | None]:
    get = METRICS[metric][0]
    out = []
    for r in rows:
        try:
            v = get(r, m)
        except (KeyError, TypeError):
            v = None
        out.append(None if v is None or not np.isfinite(v) else float(v))
    return out


def _intervals(methods: dict, rows, seed: int = 0) -> None:
    """``<metric>_low`` / ``<metric>_high``: 95 % percentile bootstrap intervals over the
    examples, beside the standard errors."""
    from . import stats

    for m, entry in methods.items():
        for metric in METRICS:
            ci = stats.mean_ci(_values(rows, metric, m), seed=seed)
            entry[f"{metric}_low"], entry[f"{metric}_high"] = ci["low"], ci["high"]


def paired_tests(rows, methods, seed: int = 0) -> list[dict]:
    """Attention attribution (attr, attr_cls) against every other method on the same
    examples, every metric: the mean paired difference (attr minus the other), a sign-flip
    permutation p-value in the better direction of the metric, and Holm over all the tests.
    Left out: the metric that defines the other method (tau with LOO against loo, tau with
    grad against grad), and attr against attr_cls."""
    from . import stats

    out = []
    for a in (m for m in methods if m in ("attr", "attr_cls")):
        for b in (m for m in methods if m not in ("attr", "attr_cls")):
            for metric, (_get, better) in METRICS.items():
                if (b == "loo" and metric.startswith("tau_loo")) or (b == "grad" and metric == "tau_grad"):
                    continue
                x, y = _values(rows, metric, a), _values(rows, metric, b)
                keep = [i for i in range(len(rows)) if x[i] is not None and y[i] is not None]
                if not keep:
                    continue
                r = stats.paired_test([x[i] for i in keep], [y[i] for i in keep], better, seed=seed)
                out.append({"method": a, "baseline": b, "metric": metric, "better": "higher" if better == "greater" else "lower",
                            "difference": r["statistic"], "n": r["n"], "p": r["p"], "exact": r["exact"]})
    for row, adj in zip(out, stats.holm([r["p"] for r in out])):
        row["p_holm"] = adj
    return out


def adversarial_rows(report: dict) -> list[dict]:
    """One flat row per epsilon of the adversarial-attention summary (the CSV)."""
    a = report.get("adversarial")
    if not a:
        return []
    out = []
    for eps, e in a["summary"].items():
        row = {"epsilon": float(eps), "layer": a["layer"], "examples": len(a["per_example"])}
        for metric in ("jsd_attention", "jsd_attention_tokens", "jsd_attribution_tokens", "tau_attention",
                       "tau_attribution", "tvd_output", "steps"):
            for k in ("mean", "median", "low", "high"):
                row[f"{metric}_{k}" if k != "mean" else metric] = e[metric][k]
        row["p_attribution_moved_less_jsd"] = e["attribution_moved_less"]["jsd"]["p"]
        row["p_attribution_moved_less_tau"] = e["attribution_moved_less"]["tau"]["p"]
        out.append(row)
    return out


#: the per-method CSV: (column, the report's key, whether its standard error is a column too)
ROW_COLUMNS = (("tau_loo", "tau_loo", True), ("tau_loo_abs", "tau_loo_abs", True), ("tau_grad", "tau_grad", True),
               ("aopc_comprehensiveness", "comprehensiveness", False), ("aopc_sufficiency", "sufficiency", False),
               *((k, k, False) for k in ("deletion_auc", "mask_aopc", "mask_naopc", "mask_accuracy", "mask_kept")))


def report_rows(report: dict) -> list[dict]:
    """One flat row per method (the CSV and the table)."""
    rows = []
    for m, r in report["methods"].items():
        row = {"method": m}
        for column, key, se in ROW_COLUMNS:
            for s in ("", "_se", "_low", "_high") if se else ("", "_low", "_high"):
                row[column + s] = r.get(key + s)
        rows.append(row | {"examples": report["examples"]})
    return rows


def report_figure(report: dict):
    """Deletion curves per method and the agreement taus (and the adversarial panel): a
    matplotlib Figure drawn off screen."""
    import matplotlib

    from .plots import new_figure
    from .stats import LEVEL  # the level of the intervals _intervals computed

    adv = report.get("adversarial")
    fig = new_figure(16, 4.4) if adv else new_figure(11, 4.2)
    axes = fig.subplots(1, 3 if adv else 2)
    a1, a2 = axes[:2]
    fr = report["settings"]["fractions"]
    colours = matplotlib.colormaps["tab20" if len(report["methods"]) > 10 else "tab10"].colors
    for i, (m, r) in enumerate(report["methods"].items()):
        a1.plot(fr, r["deletion_curve"], marker=".", label=m, color=colours[i % len(colours)],
                linestyle="--" if m == "random" else "-")
    unit = "words" if (report.get("settings") or {}).get("aggregate") == "words" else "tokens"
    a1.set_xlabel(f"fraction of content {unit} removed (most important first)")
    a1.set_ylabel("probability of the target class")
    a1.set_title("deletion curves (lower = more faithful)")
    a1.legend(fontsize=7)
    names = list(report["methods"])
    x = np.arange(len(names))
    for off, key, label in ((-0.27, "tau_loo", "tau with LOO"), (0.0, "tau_loo_abs", "tau of |score| with |LOO|"),
                            (0.27, "tau_grad", "tau with grad")):
        values = np.asarray([r.get(key) or 0.0 for r in report["methods"].values()], dtype=float)
        lows, highs = ([r.get(f"{key}_{end}") for r in report["methods"].values()] for end in ("low", "high"))
        err = [values - np.asarray(lows, dtype=float), np.asarray(highs, dtype=float) - values] \
            if None not in lows + highs else None  # the bootstrap interval of each mean
        a2.bar(x + off, values, 0.27, label=label, yerr=err, capsize=1.5,
               error_kw={"elinewidth": 0.8, "ecolor": "0.25"})
    a2.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
    a2.axhline(0, color="k", lw=0.5)
    a2.set_title(f"Kendall tau-b (mean over examples)\nbars: {LEVEL:.0%} bootstrap interval", fontsize=10)
    a2.legend(fontsize=7)
    if adv:
        a3 = axes[2]
        jsd = {e: [(r["epsilons"][e]["jsd_attention_tokens"], r["epsilons"][e]["jsd_attribution_tokens"])
                   for r in adv["per_example"]] for e in adv["summary"]}
        for eps, pts in jsd.items():
            pts = [p for p in pts if None not in p]
            if pts:
                a3.scatter(*zip(*pts), s=9, alpha=0.6, label=f"ε = {eps}")
        top = max(0.05, *(v or 0 for pts in jsd.values() for p in pts for v in p))
        a3.plot([0, top], [0, top], color="k", lw=0.6, ls=":")
        a3.set_xlabel("JSD of attention, clean vs adversarial (pooled row, head mean)")
        a3.set_ylabel("JSD of |attention attribution| (pooled row, head sum)")
        a3.set_title(f"adversarial attention, layer {adv['layer']}\n(below the diagonal: attribution moved less)", fontsize=10)
        a3.legend(fontsize=7)
    fig.suptitle(f"{report.get('model')} — {report['examples']} examples", fontsize=9)
    fig.tight_layout()
    return fig
