"""The metric of a clean / counterfactual pair (data/pairs.py), one place for every user.

A pair's answer and foil are each a set of next tokens (one token for IOI and capitals, the
years or tens digits for greater-than). From the next-token logits at the prompt's last
position:

* ``logit-diff``   mean logit of the answer set - mean logit of the foil set (the circuit
                   literature's logit difference; with one token each, logit(a) - logit(f)),
* ``logprob-diff`` log p(answer set) - log p(foil set), p(set) the summed probability,
* ``prob``         p(answer set) (the foil is not used).

:class:`PairTarget` is the scorer's per-example target of a pair (engine/scorer.py):
F = the metric, attributed per example with its own tokens.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .options import METRICS


def pair_metric(logits: torch.Tensor, answer: Sequence[int], foil: Sequence[int], metric: str = "logit-diff") -> torch.Tensor:
    """The metric of next-token ``logits`` [..., vocab] for the ``answer`` and ``foil`` token
    ids: a tensor of the leading shape (float32, or float64 for float64 logits)."""
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    a = torch.as_tensor(list(answer), device=logits.device, dtype=torch.long).expand(flat.shape[0], -1)
    f = torch.as_tensor(list(foil), device=logits.device, dtype=torch.long).expand(flat.shape[0], -1)
    return pair_metric_rows(flat, a, torch.ones_like(a, dtype=torch.bool), f, torch.ones_like(f, dtype=torch.bool),
                            metric).reshape(lead)


def pair_metric_rows(logits: torch.Tensor, answer: torch.Tensor, answer_in: torch.Tensor, foil: torch.Tensor,
                     foil_in: torch.Tensor, metric: str = "logit-diff") -> torch.Tensor:
    """:func:`pair_metric` of each row of ``logits`` [rows, vocab] with its own sets: ``answer``
    [rows, a] token ids, ``answer_in`` [rows, a] True for the real entries (sets of different
    sizes padded), the same for the foil. [rows]."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; available: {', '.join(METRICS)}")
    work = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    if metric == "logit-diff":
        def mean(idx, real):
            w = real.to(work.dtype)
            return (work.gather(-1, idx) * w).sum(-1) / w.sum(-1)
        return mean(answer, answer_in) - mean(foil, foil_in)
    logp = torch.log_softmax(work, dim=-1)

    def set_logp(idx, real):
        return torch.logsumexp(logp.gather(-1, idx).masked_fill(~real, float("-inf")), -1)
    if metric == "prob":
        return set_logp(answer, answer_in).exp()
    return set_logp(answer, answer_in) - set_logp(foil, foil_in)


class PairTarget:
    """A pair's target in the scorer: F = ``metric`` of the logits at the one kept position."""

    def __init__(self, answer: Sequence[int], foil: Sequence[int], metric: str):
        self.answer, self.foil, self.metric = [int(t) for t in answer], [int(t) for t in foil], metric

    def value(self, scorer, logits: torch.Tensor) -> torch.Tensor:
        """F per batch row of LM logits [rows, kept positions (1), vocab]."""
        return pair_metric(logits[:, -1] if logits.dim() == 3 else logits, self.answer, self.foil, self.metric)
