"""The ablations: what a removed head's output becomes, one registered :class:`Ablation` each
(``--ablation``): MIB's counterfactual (patching), mean and zero ablations. A new ablation is
one more entry (here, or from a plugin: docs/extending.md); ``circuit``, ``prune`` on pairs and
every head method that patches accept it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...registry import Registry


@dataclass(frozen=True)
class Ablation:
    """``source(task, batch, shared)``: the removed heads' outputs for one batch of pairs,
    ``{layer: [batch or 1, head, n, d]}``; ``shared`` keeps what every batch of a run reuses."""

    name: str
    description: str
    source: Callable[[Any, Any, dict], dict]
    reference: str = ""
    kind: str = "ablation"
    cost: str = ""


ABLATIONS = Registry("ablation", units="heads", command="circuit --ablation")


def _patching(task, batch, shared: dict) -> dict:
    return task.record(batch.counterfactual)[1]


def _mean(task, batch, shared: dict) -> dict:
    if "means" not in shared:
        shared["means"] = task.mean_outputs()
    # aligned at the last token (the means are as long as the longest pair)
    return {k: v[:, :, -batch.clean.shape[1]:] for k, v in shared["means"].items()}


def _zero(task, batch, shared: dict) -> dict:
    import torch

    return {k: torch.zeros_like(v) for k, v in task.record(batch.clean[:1])[1].items()}


for _a in (Ablation("patching", "the head's output on the counterfactual prompt (MIB's counterfactual ablation)",
                    _patching, "Vig et al. 2020; MIB (Mueller et al. 2025)", cost="1 counterfactual forward per batch"),
           Ablation("mean", "the head's output averaged over the clean prompts, aligned at the last token",
                    _mean, "MIB (Mueller et al. 2025)", cost="1 forward per batch, once"),
           Ablation("zero", "zero: the head's output removed", _zero, "Michel et al. 2019 (head masking)",
                    cost="none")):
    ABLATIONS.register(_a)
