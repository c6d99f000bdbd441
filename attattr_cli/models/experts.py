"""Mixture-of-experts models in float64.

transformers runs the experts of Mixtral, Qwen2-MoE, Qwen3-MoE and the like with a grouped
matrix product that takes float32 and half precision only; its ``eager`` experts (a loop over
experts) run in any dtype and compute the same function. attattr switches a float64 model to
them while it runs and puts the setting back afterwards.

Expert routing makes F(alpha A) a piecewise-smooth function of alpha: where the router's
top-k choice changes along the path, F jumps. The integration (engine) detects such paths."""

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

