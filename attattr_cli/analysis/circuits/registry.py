"""The registry of head methods: one :class:`HeadMethod` per method module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...registry import Registry

@dataclass(frozen=True)
class HeadMethod:
    name: str
    description: str
    compute: Callable[[Any], Any]  # Context -> [pairs, layer, head] float64
    kind: str = "gradient"  # causal, gradient, attribution, attention, baseline
    reference: str = ""
    passes: Callable[[Any], str] = field(default=lambda settings: "")  # what it costs per pair, in words
    default: bool = False  # computed by default (with the recommended method)
    complete: bool = False  # its scores add up to m(N) - m(empty): the residual is reported
    mlp: bool = False  # it scores MLP nodes too (--nodes heads+mlp); False: heads only


REGISTRY = Registry("head method", units="heads", command="circuit")
register = REGISTRY.register
