"""Is a context attribution right? Source removal for language models: F is the answer's joint
log-probability, log p(answer | prompt) = sum_t log p(a_t | prompt, a_<t), one forward on token
ids (float64 sums of log-softmax). Per method the top k sources (k = 1, 3, 5) are removed from
the prompt together and the **drop** F(prompt) - F(prompt without them) is reported, with
Kendall's tau-b between the method's source scores and leave-one-source-out's.

Methods, a score per source (summed over its tokens): ``attattr`` (analysis/sources.py),
``attention`` (the answer's query rows, averaged over layers, heads and rows),
``input_x_gradient`` ((dF/de_j) . e_j over the hidden size) and ``loo`` (exact
leave-one-source-out). docs/long-context.md, "Is it right? Source removal".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..registry import Registry
from .stats import kendall_tau_b

KS = (1, 3, 5)


@dataclass
class RemovalCheck:
    """Per method: its source scores, the drop of F when its top-k sources are removed (k ->
    drop), and Kendall's tau-b with leave-one-out; ``f_full`` F of the whole prompt."""

    f_full: float
    sources: list[dict]
    scores: dict[str, list[float]]
    drops: dict[str, dict[int, float]]
    agreement: dict[str, float]
    forwards: int = 0
    extra: dict = field(default_factory=dict)

    def rows(self) -> list[dict]:
        """One row per (method, k): method, k, drop, ratio to leave-one-out's drop, tau-b with LOO."""
        out = []
        for m, by_k in self.drops.items():
            for k, d in by_k.items():
                ref = self.drops.get("loo", {}).get(k)
                out.append({"method": m, "k": k, "drop": d, "of_loo": None if not ref else d / ref,
                            "tau_loo": self.agreement.get(m)})
        return out

    def to_dict(self) -> dict:
        """The check as JSON: F, the forwards, the sources (passage, start, end, text and each
        method's score), the rows (:meth:`rows`) and the agreement; what `attattr sources-check
        --json` prints."""
        sources = [{"source": s, "start": sp["start"], "end": sp["end"], "text": sp["text"],
                    "scores": {m: v[s] for m, v in self.scores.items()}} for s, sp in enumerate(self.sources)]
        return {"f_full": self.f_full, "forwards": self.forwards, "sources": sources, "rows": self.rows(),
                "tau_loo": dict(self.agreement)}

    def method_rows(self) -> list[dict]:
        """One row per method: its drop at each k (``drop_k{k}``), its share of leave-one-out's
        (``of_loo_k{k}``) and Kendall's tau-b with leave-one-out (``tau_loo``): the table of
        `attattr sources-check`."""
        from ..views.sources import removal_rows

        return removal_rows(self)

    def to_pandas(self):
        """A pandas DataFrame of :meth:`rows` (method, k, drop, of_loo, tau_loo)."""
        from ..views.notebook import data_frame

        return data_frame(self.rows(), ["method", "k", "drop", "of_loo", "tau_loo"])

    def plot(self, path=None):
        """The drop of log p(answer) per method and k as a matplotlib ``Figure``, also written to
        ``path`` (.png, .svg, .pdf; whole or not at all) when given."""
        from ..views.sources import removal_figure

        fig = removal_figure(self)
        if path is not None:
            fig.save(path)
        return fig

    def _repr_html_(self) -> str:
        from ..views.sources import removal_html

        return removal_html(self)

    def __repr__(self) -> str:
        top3 = ", ".join(f"{m} {d[max(d)]:.3g}" for m, d in self.drops.items() if d)
        return (f"RemovalCheck({len(self.sources)} sources, log p(answer) {self.f_full:.4g};"
                f" drop at the largest k: {top3})")


def _answer_logprob(model, ids: list[int], answer: list[int]) -> float:
    """F = sum_t log p(answer_t | ids, answer_<t) (one forward)."""
    seq = torch.tensor([ids + answer[:-1]], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=seq, use_cache=False).logits[0, len(ids) - 1:].double()
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(answer, device=logits.device).view(-1, 1))
    return float(logp.sum())


def _without(ids: list[int], spans: list[dict], drop: set[int]) -> list[int]:
    gone = set()
    for s in drop:
        gone.update(range(spans[s]["start"], spans[s]["end"]))
    return [t for i, t in enumerate(ids) if i not in gone]


def _per_source(values: np.ndarray, spans: list[dict]) -> list[float]:
    return [float(np.asarray(values[s["start"]:s["end"]], np.float64).sum()) for s in spans]


def attention_scores(model, ids: list[int], answer: list[int], spans: list[dict]) -> list[float]:
    """Attention from the answer's query rows to each source, averaged over layers, heads and rows."""
    from ..engine import attention

    seq = torch.tensor([ids + answer[:-1]], device=next(model.parameters()).device)
    record = attention.Record(keep="maps")  # the probabilities, through attattr's attention (any implementation)
    with attention.taken_over(model), attention.active(record), torch.no_grad():
        model(input_ids=seq, use_cache=False)
    rows = slice(len(ids) - 1, len(ids) - 1 + len(answer))
    mass = torch.stack([p[0, :, rows, :].double().mean(dim=(0, 1)) for p in record.probs.values()]).mean(0)
    return _per_source(mass.cpu().numpy(), spans)


def input_x_gradient(model, ids: list[int], answer: list[int], spans: list[dict]) -> list[float]:
    """(dF/de_j) . e_j per token, summed over each source (F the answer's joint log-probability)."""
    dev = next(model.parameters()).device
    seq = torch.tensor([ids + answer[:-1]], device=dev)
    emb = model.get_input_embeddings()(seq).detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(inputs_embeds=emb, use_cache=False).logits[0, len(ids) - 1:]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(answer, device=dev).view(-1, 1)).sum()
        (grad,) = torch.autograd.grad(logp, emb)
    per_token = (grad * emb).sum(-1)[0].double().detach().cpu().numpy()
    return _per_source(per_token, spans)


@dataclass(frozen=True)
class SourceMethod:
    """A way to score a prompt's sources for the answer's joint log-probability F: ``compute(model,
    ids, answer, spans, f_full, attattr)`` gives one score per source (or None: left out) and the
    forwards it ran."""

    name: str
    description: str
    compute: Callable[..., tuple]
    kind: str = "other"
    cost: str = ""
    reference: str = ""


SOURCE_METHODS = Registry("source method", units="sources", command="sources-check")
register = SOURCE_METHODS.register
register(SourceMethod("attattr", "the attention attribution of F, read at the rows after the passages (the scored "
                      "example's source scores)", lambda model, ids, answer, spans, f_full, attattr: (
                          None if attattr is None else [float(x) for x in attattr], 0),
                      kind="attribution", cost="none (the scored example's sources)"))
register(SourceMethod("attention", "attention from the answer's query rows, averaged over layers, heads and rows",
                      lambda model, ids, answer, spans, f_full, attattr: (
                          attention_scores(model, ids, answer, spans), 1), kind="attention", cost="1 forward"))
register(SourceMethod("input_x_gradient", "(dF/de_j) . e_j per token, summed over the source",
                      lambda model, ids, answer, spans, f_full, attattr: (
                          input_x_gradient(model, ids, answer, spans), 1),
                      kind="gradient", cost="1 forward and backward"))
register(SourceMethod("loo", "leave-one-source-out, exact: F(prompt) - F(prompt without the source)",
                      lambda model, ids, answer, spans, f_full, attattr: (
                          [f_full - _answer_logprob(model, _without(ids, spans, {s}), answer) for s in range(len(spans))],
                          len(spans)), kind="perturbation", cost="1 forward per source"))
METHODS = SOURCE_METHODS.names()


def removal_check(model, ids: list[int], answer: list[int], spans: list[dict], attattr: list[float] | None,
                  ks=KS, methods=METHODS) -> RemovalCheck:
    """Source removal (module docstring) for one prompt: ``ids`` the prompt's token ids,
    ``answer`` the answer's, ``spans`` the sources (token spans of the prompt), ``attattr`` the
    attention attribution's source scores (None: left out)."""
    f_full = _answer_logprob(model, ids, answer)
    forwards = 1
    scores: dict[str, list[float]] = {}
    for m in methods:
        got, ran = SOURCE_METHODS[m].compute(model, ids, answer, spans, f_full, attattr)
        forwards += ran
        if got is not None:
            scores[m] = got
    drops: dict[str, dict[int, float]] = {}
    cache: dict[frozenset, float] = {}
    for m, sc in scores.items():
        order = sorted(range(len(spans)), key=lambda s: (-sc[s], s))
        drops[m] = {}
        for k in ks:
            top = frozenset(order[:min(k, len(spans))])
            if top not in cache:
                cache[top] = f_full - _answer_logprob(model, _without(ids, spans, set(top)), answer)
                forwards += 1
            drops[m][k] = cache[top]
    loo = scores.get("loo")
    agreement = {m: (float(kendall_tau_b(sc, loo)) if loo is not None and len(spans) > 1 else float("nan"))
                 for m, sc in scores.items()}
    return RemovalCheck(f_full, spans, scores, drops, agreement, forwards)


def check_example(model, tokenizer, example, ks=KS, methods=METHODS) -> RemovalCheck:
    """The check for a scored LM example with sources and a continuation (``score(...,
    continuation=..., sources=..., output="logprob")``): its prompt, answer and source scores
    read from the example."""
    from .sources import key_importance, scores as source_scores, spans_of

    lm = example.meta["lm"]
    spans = spans_of(example)
    ids = [int(t) for t in np.asarray(example.input_ids)]
    answer = [int(t) for t in lm["target_ids"]]
    prompt = ids[:len(ids) - (len(answer) - 1)] if len(answer) > 1 else ids
    attattr = list(source_scores(key_importance(example), spans))
    return removal_check(model, prompt, answer, spans, attattr, ks, methods)
