"""The statistics every analysis reports its comparisons with: bootstrap and Wilson intervals,
permutation tests (a Monte-Carlo p-value is (1 + k) / (R + 1); a rank p-value is at least
1 / (n + 1) with n controls), the exact McNemar test, Holm's adjustment and Kendall's tau-b.
Random draws come from a seeded numpy Generator: the same seed gives the same numbers.
Alternatives: ``"greater"`` (the first sample's mean is larger), ``"less"``, ``"two-sided"``.
Nothing here prints.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..errors import OptionError

ALTERNATIVES = ("greater", "less", "two-sided")
LEVEL = 0.95
BOOTSTRAP = 2000
RESAMPLES = 10000


def _check_alternative(alternative: str) -> None:
    if alternative not in ALTERNATIVES:
        raise OptionError(f"unknown alternative '{alternative}'; use {', '.join(ALTERNATIVES)}")


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise OptionError(f"the interval level must be in (0, 1), got {level}")


def bootstrap_ci(values, statistic: Callable[[np.ndarray], np.ndarray] | None = None, *,
                 resamples: int = BOOTSTRAP, level: float = LEVEL, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval over the rows of ``values`` ([n] or [n, ...]).

    ``statistic(sample)`` maps an [n, ...] array to the statistic (default: the mean over
    rows, so each column gets its own interval with the rows resampled jointly, as a curve's
    points over the same examples are). Returns (low, high), each shaped like the statistic;
    NaN where there are fewer than two rows.
    """
    _check_level(level)
    if resamples < 1:
        raise OptionError(f"bootstrap resamples must be at least 1, got {resamples}")
    x = np.asarray(values, dtype=np.float64)
    stat = statistic or (lambda a: a.mean(axis=0))
    n = x.shape[0] if x.ndim else 0
    if n < 2:
        shape = np.shape(stat(x)) if n else x.shape[1:]
        nan = np.full(shape, np.nan)
        return nan, nan.copy()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    boots = np.stack([np.asarray(stat(x[i]), dtype=np.float64) for i in idx])
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(boots, [a, 1.0 - a], axis=0)
    return lo, hi


def mean_ci(values, *, resamples: int = BOOTSTRAP, level: float = LEVEL, seed: int = 0) -> dict:
    """The mean of ``values`` (NaN left out) with its bootstrap interval, as a dict
    {mean, low, high, n} (None where undefined)."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    x = x[np.isfinite(x)]
    if not len(x):
        return {"mean": None, "low": None, "high": None, "n": 0}
    lo, hi = bootstrap_ci(x, resamples=resamples, level=level, seed=seed)
    return {"mean": float(x.mean()), "low": _f(lo), "high": _f(hi), "n": int(len(x))}


def proportion_ci(k: int, n: int, level: float = LEVEL) -> tuple[float | None, float | None]:
    """Wilson score interval of the rate k / n (None, None when n is 0)."""
    _check_level(level)
    if n <= 0:
        return None, None
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def rate(k: int, n: int, level: float = LEVEL) -> dict:
    """{rate, low, high, k, n} with the Wilson interval."""
    lo, hi = proportion_ci(k, n, level)
    return {"rate": (k / n) if n else None, "low": lo, "high": hi, "k": int(k), "n": int(n)}


def percentile(observed: float, null: Sequence[float]) -> float | None:
    """The share (in %) of ``null`` strictly below ``observed``, ties counted half."""
    z = np.asarray(null, dtype=np.float64)
    if not len(z):
        return None
    return float(100.0 * ((z < observed).sum() + 0.5 * (z == observed).sum()) / len(z))


def rank_p_value(observed: float, null: Sequence[float], alternative: str = "greater") -> float | None:
    """Exact permutation p-value of one observation exchangeable with ``null`` under the
    null hypothesis: (1 + #null at least as extreme) / (len(null) + 1)."""
    _check_alternative(alternative)
    z = np.asarray(null, dtype=np.float64)
    if not len(z):
        return None
    ge = int((z >= observed).sum())
    le = int((z <= observed).sum())
    if alternative == "greater":
        k = ge
    elif alternative == "less":
        k = le
    else:
        k = min(ge, le) * 2
    return float(min(1.0, (1 + k) / (len(z) + 1)))


def _p_from(null: np.ndarray, observed: float, alternative: str, plus_one: bool) -> float:
    eps = 1e-12 * max(1.0, abs(observed))
    add = 1 if plus_one else 0
    total = len(null) + add
    if alternative == "greater":
        return float((add + (null >= observed - eps).sum()) / total)
    if alternative == "less":
        return float((add + (null <= observed + eps).sum()) / total)
    g = (add + (null >= observed - eps).sum()) / total
    l_ = (add + (null <= observed + eps).sum()) / total
    return float(min(1.0, 2 * min(g, l_)))


def permutation_test(x: Sequence[float], y: Sequence[float], alternative: str = "greater", *,
                     resamples: int = RESAMPLES, max_exact: int = 200_000, seed: int = 0) -> dict:
    """Two independent samples, statistic mean(x) - mean(y): every split of the pooled values
    into groups of len(x) and len(y) when there are at most ``max_exact`` of them (exact),
    else ``resamples`` random splits. Returns {statistic, p, exact, permutations}."""
    _check_alternative(alternative)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if not len(x) or not len(y):
        return {"statistic": None, "p": None, "exact": None, "permutations": 0}
    pooled = np.concatenate([x, y])
    n, k = len(pooled), len(x)
    observed = float(x.mean() - y.mean())
    total = pooled.sum()
    count = math.comb(n, k)
    if count <= max_exact:
        import itertools

        sums = np.fromiter((pooled[list(c)].sum() for c in itertools.combinations(range(n), k)), dtype=np.float64,
                           count=count)
        null = sums / k - (total - sums) / (n - k)
        return {"statistic": observed, "p": _p_from(null, observed, alternative, False), "exact": True,
                "permutations": int(count)}
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((resamples, n)), axis=1)[:, :k]
    sums = pooled[perms].sum(axis=1)
    null = sums / k - (total - sums) / (n - k)
    return {"statistic": observed, "p": _p_from(null, observed, alternative, True), "exact": False,
            "permutations": int(resamples)}


def paired_test(x: Sequence[float], y: Sequence[float], alternative: str = "greater", *,
                resamples: int = RESAMPLES, max_exact: int = 16, seed: int = 0) -> dict:
    """Paired sign-flip permutation test of mean(x - y) (pairs with equal values drop out of
    the enumeration, which does not change the p-value). Exact over all 2^m sign patterns of
    the m nonzero differences when m <= ``max_exact``, else ``resamples`` random patterns.
    Returns {statistic, p, exact, n}."""
    _check_alternative(alternative)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise OptionError(f"paired samples differ in length: {len(x)} and {len(y)}")
    keep = np.isfinite(x) & np.isfinite(y)
    d = (x - y)[keep]
    n = len(d)
    if not n:
        return {"statistic": None, "p": None, "exact": None, "n": 0}
    observed = float(d.mean())
    nz = d[d != 0]
    m = len(nz)
    if m == 0:
        return {"statistic": observed, "p": 1.0, "exact": True, "n": n}
    if m <= max_exact:
        signs = ((np.arange(2 ** m)[:, None] >> np.arange(m)) & 1) * 2 - 1
        null = (signs * nz).sum(axis=1) / n
        return {"statistic": observed, "p": _p_from(null, observed, alternative, False), "exact": True, "n": n}
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2, size=(resamples, m)) * 2 - 1
    null = (signs * nz).sum(axis=1) / n
    return {"statistic": observed, "p": _p_from(null, observed, alternative, True), "exact": False, "n": n}


def mcnemar(a: Sequence[bool], b: Sequence[bool], alternative: str = "greater") -> dict:
    """Exact McNemar test for paired right/wrong outcomes: ``a`` better than ``b``
    ("greater") means more examples right under a only than under b only. Returns
    {a_only, b_only, difference (accuracy a - b), p}."""
    _check_alternative(alternative)
    a = np.asarray(a, dtype=bool)
    b = np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise OptionError(f"paired samples differ in length: {len(a)} and {len(b)}")
    n01 = int((a & ~b).sum())
    n10 = int((~a & b).sum())
    diff = float(a.mean() - b.mean()) if len(a) else None
    if n01 + n10 == 0:
        return {"a_only": n01, "b_only": n10, "difference": diff, "p": 1.0}
    from scipy.stats import binomtest

    p = binomtest(n01, n01 + n10, 0.5, alternative=alternative).pvalue
    return {"a_only": n01, "b_only": n10, "difference": diff, "p": float(p)}


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None); reject at level alpha where the
    adjusted p-value is at most alpha, controlling the family-wise error rate."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b with ties: (C - D) / sqrt((P - T_x) (P - T_y)), P = n(n-1)/2 pairs,
    T_x, T_y the pairs tied in x, in y. NaN when either vector is constant or n < 2."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("kendall_tau_b needs two vectors of the same length")
    n = len(x)
    if n < 2:
        return float("nan")
    iu = np.triu_indices(n, 1)
    sx = np.sign(x[:, None] - x[None, :])[iu]
    sy = np.sign(y[:, None] - y[None, :])[iu]
    untied_x = np.count_nonzero(sx)
    untied_y = np.count_nonzero(sy)
    if untied_x == 0 or untied_y == 0:
        return float("nan")
    return float((sx * sy).sum() / math.sqrt(untied_x * untied_y))


def kendall_tau_halves(per_example: np.ndarray, seed: int = 0) -> float | None:
    """Kendall tau-b between the mean over one random half of the rows and the other half."""
    x = np.asarray(per_example, dtype=np.float64)
    n = x.shape[0]
    if n < 2:
        return None
    order = np.random.default_rng(seed).permutation(n)
    a = x[order[: n // 2]].mean(axis=0).ravel()
    b = x[order[n // 2:]].mean(axis=0).ravel()
    t = kendall_tau_b(a, b)
    return None if t is None or not np.isfinite(t) else float(t)


def rank_intervals(per_example: np.ndarray, *, resamples: int = 1000, level: float = LEVEL, seed: int = 0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap over examples (rows) of the rank (1 = most important) each column of the
    row mean takes: per column its (low, high) rank interval."""
    x = np.asarray(per_example, dtype=np.float64)
    x = x.reshape(x.shape[0], -1)

    def ranks(sample):
        m = sample.mean(axis=0)
        order = np.argsort(-m, kind="stable")
        r = np.empty(len(m))
        r[order] = np.arange(1, len(m) + 1)
        return r

    return bootstrap_ci(x, ranks, resamples=resamples, level=level, seed=seed)


def _f(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None
