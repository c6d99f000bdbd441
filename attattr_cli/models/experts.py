"""Mixture-of-experts models in float64 (docs/models.md, "Mixture of experts"): transformers'
grouped expert product takes float32 and half precision only, so a float64 model is switched to
its ``eager`` experts (the same function, a loop over experts) while attattr runs it, and the
setting is put back afterwards."""

from __future__ import annotations

import torch

EAGER = "eager"


def eager_experts(model: torch.nn.Module) -> list:
    """Switch a model's experts to the eager implementation; returns [(config, old)] to restore."""
    configs = {id(m.config): m.config for m in model.modules() if getattr(m, "config", None) is not None}
    changed = [(cfg, cfg._experts_implementation_internal) for cfg in configs.values()
               if getattr(cfg, "_experts_implementation", None) not in (None, EAGER)]
    for cfg, _ in changed:
        cfg._experts_implementation_internal = EAGER
    return changed


def restore(changed: list) -> None:
    for cfg, old in changed:
        cfg._experts_implementation_internal = old

