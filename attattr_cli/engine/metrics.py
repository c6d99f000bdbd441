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
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; available: {', '.join(METRICS)}")
    work = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    a = torch.as_tensor(list(answer), device=work.device, dtype=torch.long)
    f = torch.as_tensor(list(foil), device=work.device, dtype=torch.long)
    if metric == "logit-diff":
        return work.index_select(-1, a).mean(-1) - work.index_select(-1, f).mean(-1)
    logp = torch.log_softmax(work, dim=-1)
    if metric == "prob":
        return logp.index_select(-1, a).exp().sum(-1)
    return torch.logsumexp(logp.index_select(-1, a), -1) - torch.logsumexp(logp.index_select(-1, f), -1)


class PairTarget:
    """A pair's target in the scorer: F = ``metric`` of the logits at the one kept position."""

    def __init__(self, answer: Sequence[int], foil: Sequence[int], metric: str):
        self.answer, self.foil, self.metric = [int(t) for t in answer], [int(t) for t in foil], metric

    def value(self, scorer, logits: torch.Tensor) -> torch.Tensor:
        """F per batch row of LM logits [rows, kept positions (1), vocab]."""
        return pair_metric(logits[:, -1] if logits.dim() == 3 else logits, self.answer, self.foil, self.metric)
