"""Convergence states of an example-layer's integral: the codes the store's ``convergence``
dataset holds (schema 1.3), their names, and what they mean (docs/integration.md).

Torch-free: the engine sets them (engine/adaptive.py), the store, `info`, the report and
the analyses read them.
"""

from __future__ import annotations

import numpy as np

CONVERGED = 0  # the estimate is under the tolerance and the completeness residual agrees
CAP_HIT = 1  # the node cap stopped the refinement with the estimate above the tolerance
RESIDUAL = 2  # the estimate is under the tolerance but the completeness residual is not
NON_SMOOTH = 3  # F jumps along the path (a routing switch, say): completeness cannot hold there
ESTIMATE = 4  # a fixed rule whose embedded estimate is above the tolerance checked
UNCHECKED = 255  # a store written before schema 1.3: not judged

NAMES = {CONVERGED: "converged", CAP_HIT: "node cap hit", RESIDUAL: "residual disagrees",
         NON_SMOOTH: "non-smooth path", ESTIMATE: "estimate above tolerance", UNCHECKED: "not checked"}


def name(state: int) -> str:
    return NAMES.get(int(state), f"state {int(state)}")


def unconverged(states) -> np.ndarray:
    """Per layer: True where the integral was judged and is not converged (unchecked: False)."""
    s = np.asarray(states if states is not None else [], dtype=np.int64)
    return (s != CONVERGED) & (s != UNCHECKED)


def unconverged_layers(layers, states) -> dict[int, str]:
    """{layer: why} for the layers whose integral was judged and did not converge ({} for none,
    or for states None: a store before the check)."""
    if states is None:
        return {}
    s = np.ravel(np.asarray(states))
    return {int(layer): name(state) for layer, state, bad in zip(layers, s, unconverged(s)) if bad}


def counts(states) -> dict[str, int]:
    """{state name: example-layers} over the states given (any shape)."""
    s = np.asarray(states if states is not None else [], dtype=np.int64).ravel()
    return {NAMES.get(int(k), f"state {int(k)}"): int((s == k).sum()) for k in np.unique(s)}
