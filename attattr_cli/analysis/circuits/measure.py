"""What a circuit does to the metric, on the pairs a method is given: a method that chooses
among candidate rankings measures their curves (analysis/ablation.py, the evaluation's own
machine) on its pairs only (a method never sees the evaluation's pairs when the pairs are
split: split.py).
"""

from __future__ import annotations

import numpy as np

from ..ablation import PERCENTAGES, curve, curve_from, ends, keep_masks, per_pair_metrics  # noqa: F401


def measured_best(ctx, rankings: list, ks) -> int:
    """The index of the ranking whose curve (CMD's ranking by |score|) is nearest 1 at ``ks``
    on ``ctx``'s pairs, each point weighted by the width CMD's trapezoids give it; each
    distinct set is run once (one forward per pair and set). Ties: the first."""
    masks = np.concatenate([keep_masks(r, True, ks) for r in rankings])
    unique, which = np.unique(masks.reshape(len(masks), -1), axis=0, return_inverse=True)
    f = curve(ctx, unique.reshape(-1, *masks.shape[1:]))[1][which.ravel()]
    ks_all = list(PERCENTAGES)
    width = np.array([(ks_all[min(i + 1, len(ks_all) - 1)] - ks_all[max(i - 1, 0)]) / 2
                      for i in (ks_all.index(k) for k in ks)])
    cost = (np.abs(1 - f.reshape(len(rankings), len(ks))) * width).sum(1)
    return int(np.argmin(cost))
