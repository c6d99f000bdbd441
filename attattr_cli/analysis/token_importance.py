"""Token importance: runs the methods registered in :mod:`attattr_cli.analysis.methods`
(:class:`ModelRunner`, :class:`Context`) and keeps the names exported before the registry.

Every method returns a float vector of length n (all tokens, special ones included; the
faithfulness metrics use only the content tokens). "pool" is the position the classifier
reads: 0 ([CLS]) for encoders, n - 1 for decoders. F is the store's target output, the same
F as the attribution; ``loo`` and the faithfulness metrics always measure the target class's
probability. docs/faithfulness.md, "Token importance"; docs/method.md section 5.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from ..errors import OptionError
from ..models.loading import LoadedModel
from . import methods as registry
from .methods.builtin import (  # noqa: F401 - the pure functions, re-exported
    attention_last,
    attention_mean,
    attn_grad,
    attn_grad_matrix,
    attr_columns,
    attr_pooled,
    random_scores,
    rollout,
    rollout_matrix,
)

#: the default set (the first release's methods): name -> description
METHODS: dict[str, str] = {m: registry.REGISTRY[m].description for m in registry.DEFAULT}
#: every registered method: name -> description
ALL_METHODS: dict[str, str] = {m.name: m.description for m in registry.REGISTRY.values()}
ATTRIBUTION_METHODS = tuple(m.name for m in registry.REGISTRY.values() if "attribution" in m.needs)
ERASE_MODES = ("remove", "mask")
VERSION = registry.VERSION
#: tokens per forward pass of the analyses' batched runs (sequences of one length share a
#: pass up to this many tokens; 1: one sequence per pass)
MAX_TOKENS = 16384
#: tokens per forward and backward pass when the gradients of several examples share one
GRAD_TOKENS = 2048


check_methods = registry.check  # method names validated (``all`` stays for :func:`expand_methods`)


def expand_methods(methods: Sequence[str], loaded=None) -> tuple[list[str], list[str]]:
    """``all``: every method available here that applies to ``loaded``; returns the methods
    and one note per method left out. A method named explicitly that does not apply to the
    model is an error."""
    out, notes = registry.expand(methods, loaded)
    if loaded is not None:
        registry.check_applies([m for m in methods if m != "all"], loaded)
    return out, notes


def pool_position(n: int, is_decoder: bool) -> int:
    return n - 1 if is_decoder else 0


# -- model side ------------------------------------------------------------------------

@dataclass
class Prepared:
    """One encoded example with the class whose output is explained."""

    index: int
    input_ids: np.ndarray  # [n] int64
    token_type_ids: np.ndarray | None  # [n] or None
    segment_ids: np.ndarray  # [n]: 0/1 segments, -1 special tokens
    target: int
    pool: int

    @property
    def n(self) -> int:
        return len(self.input_ids)

    @property
    def content(self) -> np.ndarray:
        """Positions that the metrics rank and erase: every non-special token (all tokens
        when the tokenizer marks none as special)."""
        c = np.flatnonzero(np.asarray(self.segment_ids) >= 0)
        return c if len(c) else np.arange(self.n)


def model_inputs(examples: Sequence[Prepared], device) -> dict[str, torch.Tensor]:
    """``input_ids`` and, where the model takes them, ``token_type_ids`` [examples, n] of
    examples of one length, on ``device``."""
    inputs = {"input_ids": torch.tensor([list(ex.input_ids) for ex in examples], device=device)}
    if examples[0].token_type_ids is not None:
        inputs["token_type_ids"] = torch.tensor([list(ex.token_type_ids) for ex in examples], device=device)
    return inputs


class ModelRunner:
    """Runs one loaded classifier for token importance and erasure metrics.

    Every forward goes through attattr's attention takeover (plain attention unless a
    plan is active), so counterfactual attention and ordinary forwards share one path.
    """

    def __init__(self, loaded: LoadedModel, output: str = "prob", erase: str = "remove",
                 max_tokens: int = MAX_TOKENS):
        if erase not in ERASE_MODES:
            raise OptionError(f"unknown erase mode '{erase}'; available: {', '.join(ERASE_MODES)}")
        self.loaded = loaded
        self.model = loaded.model
        self.output = output
        self.erase = erase
        self.max_tokens = max_tokens
        self.device = next(self.model.parameters()).device
        mask_id = getattr(loaded.tokenizer, "mask_token_id", None)
        if erase == "mask" and mask_id is None:
            raise OptionError("--erase mask needs a tokenizer with a mask token; use --erase remove")
        self.mask_id = mask_id
        self.forwards = 0  # sequences run (for reports)
        self.notes: dict[str, dict] = {}  # per method, per example: what a method reports of itself (IG's completeness)
        # sequence -> class probabilities, while a caller batches several requests
        # (:meth:`prefetch`, :meth:`caching`); None: every call runs its own sequences
        self.cache: dict[tuple, np.ndarray] | None = None
        self.grad_cache: dict[tuple, dict] | None = None

    # sequences -------------------------------------------------------------------------
    def erased(self, ex: Prepared, keep: np.ndarray, erase: str | None = None) -> tuple[tuple, tuple | None]:
        """The input with the positions where ``keep`` is False erased (``erase``: remove or
        mask; default the runner's)."""
        keep = np.asarray(keep, dtype=bool)
        ids = np.asarray(ex.input_ids)
        tt = None if ex.token_type_ids is None else np.asarray(ex.token_type_ids)
        if (erase or self.erase) == "remove":
            return tuple(ids[keep].tolist()), None if tt is None else tuple(tt[keep].tolist())
        ids = ids.copy()
        ids[~keep] = self.mask_id
        return tuple(ids.tolist()), None if tt is None else tuple(tt.tolist())

    def probabilities(self, ex: Prepared, keeps: Sequence[np.ndarray], erase: str | None = None) -> np.ndarray:
        """Class probabilities [len(keeps), C] of the example with each keep-mask applied.

        Identical inputs run once; inputs of equal length share a batch (no padding). Inside
        :meth:`caching`, sequences a :meth:`prefetch` already ran are not run again."""
        if erase == "mask" and self.mask_id is None:
            raise OptionError("masking needs a tokenizer with a mask token")
        seqs = [self.erased(ex, k, erase) for k in keeps]
        results = self._run(seqs, ex.index)
        return np.stack([results[s] for s in seqs])

    def prefetch(self, requests: Iterable[tuple[Prepared, Sequence[np.ndarray], str | None]]) -> None:
        """Run the sequences of several requests ``(example, keeps, erase)`` together
        (grouped by length across the examples, at most ``max_tokens`` tokens per pass) and
        keep their probabilities for the :meth:`probabilities` calls that follow (inside
        :meth:`caching`). Each sequence's numbers are those a call of its own gives, up to
        the float rounding of a batch of another size."""
        seqs: dict[tuple, int] = {}
        for ex, keeps, erase in requests:
            if erase == "mask" and self.mask_id is None:
                raise OptionError("masking needs a tokenizer with a mask token")
            for k in keeps:
                seqs.setdefault(self.erased(ex, k, erase), ex.index)
        if seqs:
            self._run(list(seqs), None, owners=seqs)

    @contextmanager
    def caching(self):
        """Within the block, probabilities are kept per sequence (see :meth:`prefetch`) and
        gradients per example (:meth:`prefetch_gradients`)."""
        old, old_grads = self.cache, self.grad_cache
        self.cache = {} if old is None else old
        self.grad_cache = {} if old_grads is None else old_grads
        try:
            yield self
        finally:
            self.cache, self.grad_cache = old, old_grads

    def clear(self) -> None:
        """Forget what :meth:`caching` kept so far."""
        if self.cache is not None:
            self.cache.clear()
        if self.grad_cache is not None:
            self.grad_cache.clear()

    def _run(self, seqs: Sequence[tuple], index: int | None, owners: dict | None = None) -> dict[tuple, np.ndarray]:
        """{sequence: class probabilities} for the given (ids, token types) sequences: the
        cached ones looked up, the others run in batches of equal length."""
        from ..engine import attention

        cache = self.cache
        results: dict[tuple, np.ndarray] = {}
        by_len: dict[int, list[tuple]] = {}
        for s in seqs:
            if s in results:
                continue
            if cache is not None and s in cache:
                results[s] = cache[s]
                continue
            results[s] = None
            by_len.setdefault(len(s[0]), []).append(s)
        if not by_len:
            return results
        with attention.taken_over(self.model) as layers, torch.no_grad(), \
                attention.first_token_only(attention.first_token_output(self.model, layers)):
            for length, group in by_len.items():
                if length == 0:
                    where = index if owners is None else owners[group[0]]
                    raise OptionError(f"example {where}: erasing every token leaves an empty input")
                per = max(1, self.max_tokens // max(length, 1))
                for start in range(0, len(group), per):
                    chunk = group[start:start + per]
                    ids = np.array([c[0] for c in chunk], dtype=np.int64)
                    inputs = {"input_ids": torch.from_numpy(ids).to(self.device)}
                    if chunk[0][1] is not None:
                        tt = np.array([c[1] for c in chunk], dtype=np.int64)
                        inputs["token_type_ids"] = torch.from_numpy(tt).to(self.device)
                    logits = self.model(**inputs).logits.double()
                    self.forwards += len(chunk)
                    probs = torch.softmax(logits, -1).cpu().numpy()
                    for c, p in zip(chunk, probs):
                        results[c] = p
                        if cache is not None:
                            cache[c] = p
        return results

    def target_probability(self, ex: Prepared, keeps: Sequence[np.ndarray]) -> np.ndarray:
        return self.probabilities(ex, keeps)[:, ex.target]

    # methods -----------------------------------------------------------------------------
    def loo_keeps(self, ex: Prepared) -> list[np.ndarray]:
        """The full input, then the input without token j for every position j."""
        return [np.ones(ex.n, dtype=bool), *~np.eye(ex.n, dtype=bool)]

    def loo(self, ex: Prepared) -> np.ndarray:
        """p(x)_t - p(x with token j erased)_t for every position j."""
        p = self.target_probability(ex, self.loo_keeps(ex))
        return p[0] - p[1:]

    def gradients(self, ex: Prepared) -> dict[str, np.ndarray]:
        """One forward and backward: the attention of every layer, dF/dA of every layer,
        the word embeddings and dF/d(embeddings) (inside :meth:`caching`, those a
        :meth:`prefetch_gradients` computed)."""
        key = self._grad_key(ex)
        if self.grad_cache is not None and key in self.grad_cache:
            return self.grad_cache[key]
        return self._gradients([ex])[0]

    def prefetch_gradients(self, examples: Sequence[Prepared]) -> None:
        """:meth:`gradients` of several examples, those of one length in shared passes (one
        forward and one backward of the sum of their F; every row's gradients are its own),
        kept for the calls that follow inside :meth:`caching`."""
        if self.grad_cache is None:
            return
        todo = [ex for ex in examples if self._grad_key(ex) not in self.grad_cache]
        by_shape: dict[tuple, list[Prepared]] = {}
        for ex in todo:
            by_shape.setdefault((ex.n, ex.token_type_ids is None), []).append(ex)
        for (n, _), group in by_shape.items():
            per = max(1, GRAD_TOKENS // max(n, 1))
            for start in range(0, len(group), per):
                part = group[start:start + per]
                for ex, g in zip(part, self._gradients(part)):
                    self.grad_cache[self._grad_key(ex)] = g

    @staticmethod
    def _grad_key(ex: Prepared) -> tuple:
        return (tuple(np.asarray(ex.input_ids).tolist()),
                None if ex.token_type_ids is None else tuple(np.asarray(ex.token_type_ids).tolist()), int(ex.target))

    def _gradients(self, examples: Sequence[Prepared]) -> list[dict[str, np.ndarray]]:
        """:meth:`gradients` of examples of one length in one forward and backward."""
        from ..engine import attention

        model = self.model
        inputs = model_inputs(examples, self.device)
        record = attention.Record(keep_graph=True)
        rows = torch.arange(len(examples), device=self.device)
        targets = torch.tensor([int(ex.target) for ex in examples], device=self.device)
        with attention.taken_over(model) as layers, torch.enable_grad(), attention.active(record):
            emb = model.get_input_embeddings()(inputs.pop("input_ids")).detach().requires_grad_(True)
            logits = model(inputs_embeds=emb, **inputs).logits
            work = logits.double() if logits.dtype == torch.float64 else logits.float()
            out = work if self.output == "logit" else torch.softmax(work, -1)
            f = out[rows, targets].sum()  # rows are independent: each row's gradients are its own F's
            live = [record.live[("self", i)] for i in range(len(layers))]
            grads = torch.autograd.grad(f, [emb, *live])
        self.forwards += len(examples)
        attn = torch.stack([a.detach() for a in live], 1).double().cpu().numpy()  # [b, layer, head, q, k]
        attn_grad = torch.stack(grads[1:], 1).double().cpu().numpy()
        emb_np = emb.detach().double().cpu().numpy()
        emb_grad = grads[0].double().cpu().numpy()
        return [{"attention": attn[r], "attention_grad": attn_grad[r], "embedding": emb_np[r],
                 "embedding_grad": emb_grad[r]} for r in range(len(examples))]

    def compute(self, ex: Prepared, methods: Sequence[str], attribution: np.ndarray | None = None,
                seed: int = 0) -> dict[str, np.ndarray]:
        """The requested methods' scores for one example ({method: [n] float64})."""
        ctx = Context(self, ex, attribution, seed)
        return {m: np.asarray(registry.REGISTRY[m].compute(ctx), dtype=np.float64) for m in methods}


class Context:
    """What a method may use for one example: the runner (the model), the example, the
    store's attribution, the seed, and the forward and backward that several methods share
    (``gradients``, computed on first use)."""

    def __init__(self, runner: ModelRunner, ex: Prepared, attribution: np.ndarray | None, seed: int):
        self.runner = runner
        self.ex = ex
        self.attribution = attribution
        self.seed = seed
        self._gradients = None

    @property
    def gradients(self) -> dict[str, np.ndarray]:
        if self._gradients is None:
            self._gradients = self.runner.gradients(self.ex)
        return self._gradients


def params_for(method: str, output: str, erase: str, seed: int, score_options: dict | None = None) -> dict:
    """What defines a stored method's numbers (kept with them in the store)."""
    return registry.REGISTRY[method].store_params(registry.Settings(output, erase, int(seed), score_options))


Progress = Callable[[int, int, str], None]
