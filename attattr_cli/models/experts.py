"""Mixture-of-experts models in float64.

transformers runs the experts of Mixtral, Qwen2-MoE, Qwen3-MoE and the like with a grouped
matrix product that takes float32 and half precision only; its ``eager`` experts (a loop over
experts) run in any dtype and compute the same function. attattr switches a float64 model to
them while it runs and puts the setting back afterwards.

Expert routing makes F(alpha A) a piecewise-smooth function of alpha: where the router's
top-k choice changes along the path, F jumps. The integration (engine) detects such paths."""

from __future__ import annotations

import contextlib

import torch

EAGER = "eager"


def _configs(model: torch.nn.Module) -> list:
    seen, out = set(), []
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and id(cfg) not in seen:
            seen.add(id(cfg))
            if getattr(cfg, "_experts_implementation", None) not in (None, EAGER):
                out.append(cfg)
    return out


def eager_experts(model: torch.nn.Module) -> list:
    """Switch a model's experts to the eager implementation; returns [(config, old)] to restore."""
    changed = []
    for cfg in _configs(model):
        changed.append((cfg, cfg._experts_implementation_internal))
        cfg._experts_implementation_internal = EAGER
    return changed


def restore(changed: list) -> None:
    for cfg, old in changed:
        cfg._experts_implementation_internal = old


@contextlib.contextmanager
def float64_experts(model: torch.nn.Module):
    """Eager experts inside the block where the model is float64 (nothing otherwise)."""
    param = next(model.parameters(), None)
    changed = eager_experts(model) if param is not None and param.dtype == torch.float64 else []
    try:
        yield
    finally:
        restore(changed)
