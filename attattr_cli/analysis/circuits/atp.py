"""Attribution patching (AtP; Nanda 2023, Kramar et al. 2024; EAP at node level): the
first-order estimate of patching one head, ``<dm/dz_h, z_h - z'_h>`` at the clean run."""

from __future__ import annotations

import numpy as np

from .registry import HeadMethod, register
from .gates import gate_gradients


register(HeadMethod(
    name="atp",
    description="gradient of the metric at the clean run times the head's output change (clean - ablated)",
    compute=lambda ctx: gate_gradients(ctx, np.array([1.0]), np.array([1.0])),
    kind="gradient",
    reference="Kramar et al. 2024 (AtP); Syed et al. 2023 (EAP)",
    passes=lambda s: "1 counterfactual forward + 1 forward and backward",
    default=True,
    mlp=True,
))
