"""MIB's faithfulness curve at node level (Mueller et al. 2025, circuit track): for each k in
``PERCENTAGES`` the top ``int(k N)`` heads kept and every other head ablated,
``f(k) = (m(C) - m(empty)) / (m(N) - m(empty))``; CPR the area under f, CMD under |1 - f|,
with percentile bootstrap intervals over pairs. docs/circuits.md, "The evaluation".
"""

from __future__ import annotations

import numpy as np

from ..ablation import PERCENTAGES, curve_from  # noqa: F401 (PERCENTAGES: the curve's k, for the API)


def area(ks, f) -> tuple[float, float]:
    """(CPR, CMD) of a curve by trapezoids over k."""
    ks, f = np.asarray(ks, float), np.asarray(f, float)
    dx = np.diff(ks)
    cpr = float((dx * (f[:-1] + f[1:]) / 2).sum())
    cmd = float((dx * (np.abs(1 - f[:-1]) + np.abs(1 - f[1:])) / 2).sum())
    return cpr, cmd


def bootstrap(per_signed, per_abs, clean, empty, samples: int = 1000, seed: int = 0, level: float = 0.95):
    """Percentile intervals of CPR (signed ranking) and CMD (absolute ranking) over pairs
    (``stats.bootstrap_ci``, the pairs resampled, the rankings held fixed)."""
    from .. import stats

    k = len(per_signed)

    def both(rows):  # rows: the resampled pairs of [signed masks..., absolute masks..., m(N), m(empty)]
        t = np.ascontiguousarray(rows.T)
        return (area(PERCENTAGES, curve_from(t[:k], t[2 * k], t[2 * k + 1]))[0],
                area(PERCENTAGES, curve_from(t[k:2 * k], t[2 * k], t[2 * k + 1]))[1])

    lo, hi = stats.bootstrap_ci(np.column_stack([per_signed.T, per_abs.T, clean, empty]), both,
                                resamples=samples, level=level, seed=seed)
    return (lo[0], hi[0]), (lo[1], hi[1])


# below this share of max(1, |m(N)|), m(N) - m(empty) is float noise, not an effect
GAP_NOISE = 1e-4


def check_gap(clean, empty, ablation: str = "patching") -> None:
    """Refuse (DataError, one line) ends m(N) and m(empty) (per pair; their means compared)
    that are equal within noise: f = (m(C) - m(empty)) / (m(N) - m(empty)) would divide noise
    by noise (every curve -1, CPR and CMD meaningless)."""
    from ...errors import DataError

    n, e = float(np.mean(clean)), float(np.mean(empty))
    if abs(n - e) >= GAP_NOISE * max(1.0, abs(n)):  # NaN fails this too
        if n < e:  # defined, but the clean model shows the behaviour less than with every head ablated
            import warnings

            warnings.warn(f"m(N) {n:.4g} is below m(empty) {e:.4g}: the model does not show this behaviour on these "
                          "pairs (the answer is no more likely than with every head ablated), so the curves measure "
                          "no circuit of it", UserWarning, stacklevel=2)
        return
    cause = ("the counterfactuals do not change the metric" if ablation == "patching"
             else f"ablating every head ({ablation}) does not change the metric")
    raise DataError(f"{cause}: m(N) {n:.6g} and m(empty) {e:.6g} differ by {abs(n - e):.2g}, within noise, so the"
                    " faithfulness ratio (m(C) - m(empty)) / (m(N) - m(empty)) is undefined; give pairs whose"
                    " counterfactual changes the answer")
