"""Known answers for the statistics module (attattr_cli/analysis/stats.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from attattr_cli.analysis import stats
from attattr_cli.errors import OptionError


def test_rank_p_value_counts_controls_at_least_as_extreme():
    null = [0.1, 0.2, 0.3, 0.4]
    assert stats.rank_p_value(0.5, null) == pytest.approx(1 / 5)  # above all: the smallest possible
    assert stats.rank_p_value(0.3, null) == pytest.approx(3 / 5)  # 0.3 and 0.4 at least as large
    assert stats.rank_p_value(0.0, null, "less") == pytest.approx(1 / 5)
    assert stats.percentile(0.5, null) == 100.0
    assert stats.percentile(0.3, null) == pytest.approx(62.5)  # two below, one tie counted half
    assert stats.rank_p_value(1.0, []) is None


def test_permutation_p_value_on_a_constructed_case():
    # x = {3, 4}, y = {0, 1, 2}: of the C(5, 2) = 10 splits only {3, 4} reaches the observed
    # difference of means, so the exact one-sided p-value is 1/10.
    r = stats.permutation_test([3, 4], [0, 1, 2], "greater")
    assert r["exact"] and r["permutations"] == 10
    assert r["statistic"] == pytest.approx(3.5 - 1.0)
    assert r["p"] == pytest.approx(1 / 10)
    # two-sided: {0, 1} is as extreme the other way
    assert stats.permutation_test([3, 4], [0, 1, 2], "two-sided")["p"] == pytest.approx(2 / 10)
    # by brute force on a case with ties
    x, y = [1.0, 1.0, 2.0], [0.0, 1.0, 1.0, 2.0]
    pooled = x + y
    obs = np.mean(x) - np.mean(y)
    hits = total = 0
    for c in itertools.combinations(range(7), 3):
        a = [pooled[i] for i in c]
        b = [pooled[i] for i in range(7) if i not in c]
        hits += np.mean(a) - np.mean(b) >= obs - 1e-12
        total += 1
    assert stats.permutation_test(x, y)["p"] == pytest.approx(hits / total)


def test_monte_carlo_permutation_agrees_with_exact_and_is_seeded():
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.5, 1, 8), rng.normal(0, 1, 9)
    exact = stats.permutation_test(x, y)
    mc = stats.permutation_test(x, y, max_exact=0, resamples=20000, seed=1)
    assert exact["exact"] and not mc["exact"]
    assert mc["p"] == pytest.approx(exact["p"], abs=0.01)
    assert mc == stats.permutation_test(x, y, max_exact=0, resamples=20000, seed=1)


def test_paired_sign_flip_exact():
    # differences 1, 2, 3 (all positive): only the all-plus pattern of 2^3 reaches the mean
    r = stats.paired_test([2, 3, 4, 5], [1, 1, 1, 5])
    assert r["exact"] and r["p"] == pytest.approx(1 / 8)
    assert r["statistic"] == pytest.approx(6 / 4)
    assert stats.paired_test([1, 2], [1, 2])["p"] == 1.0
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.3, 1, 40), rng.normal(0, 1, 40)
    assert stats.paired_test(a, b, seed=4) == stats.paired_test(a, b, seed=4)


def test_mcnemar_is_the_binomial_test_on_discordant_pairs():
    a = [1] * 10 + [0] * 2 + [1] * 5 + [0] * 3
    b = [0] * 10 + [1] * 2 + [1] * 5 + [0] * 3
    r = stats.mcnemar(np.array(a, bool), np.array(b, bool))
    assert (r["a_only"], r["b_only"]) == (10, 2)
    # P(X >= 10), X ~ Bin(12, 1/2)
    expected = sum(math.comb(12, k) for k in range(10, 13)) / 2 ** 12
    assert r["p"] == pytest.approx(expected)
    assert r["difference"] == pytest.approx(8 / 20)


def test_holm_known_answer():
    # sorted 0.01, 0.02, 0.04 -> 3*0.01, max(0.03, 2*0.02), max(0.04, 1*0.04)
    assert stats.holm([0.04, 0.01, None, 0.02]) == pytest.approx([0.04, 0.03, None, 0.04])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_bootstrap_interval_covers_a_simulated_mean():
    # 95 % percentile intervals of the mean of 60 normal draws cover the true mean in about
    # 95 % of 200 simulated data sets (binomial sd ~1.5 %: accept 89 %..99 %)
    rng = np.random.default_rng(11)
    covered = 0
    for k in range(200):
        x = rng.normal(2.0, 1.0, 60)
        lo, hi = stats.bootstrap_ci(x, resamples=500, seed=k)
        covered += lo <= 2.0 <= hi
    assert 0.89 <= covered / 200 <= 0.99


def test_bootstrap_columns_and_determinism():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4)) + np.arange(4)
    lo, hi = stats.bootstrap_ci(x, seed=5)
    assert lo.shape == hi.shape == (4,)
    assert np.all(lo < x.mean(0)) and np.all(x.mean(0) < hi)
    lo2, hi2 = stats.bootstrap_ci(x, seed=5)
    assert np.array_equal(lo, lo2) and np.array_equal(hi, hi2)
    assert not np.array_equal(lo, stats.bootstrap_ci(x, seed=6)[0])
    assert stats.mean_ci([1.0, 2.0, None, 3.0], seed=2) == stats.mean_ci([1.0, 2.0, None, 3.0], seed=2)
    assert np.all(np.isnan(stats.bootstrap_ci([1.0])[0]))
    with pytest.raises(OptionError):
        stats.bootstrap_ci(x, level=1.5)


def test_wilson_interval_known_answer():
    # Wilson, 8 of 10 at 95 %: centre (8 + z^2/2) / (10 + z^2), half width z sqrt(pq/n + z^2/4n^2) / (1 + z^2/n)
    z = 1.959963984540054
    n, p = 10, 0.8
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo, hi = stats.proportion_ci(8, 10)
    assert lo == pytest.approx(centre - half) and hi == pytest.approx(centre + half)
    assert stats.rate(0, 0)["rate"] is None


def test_rank_stability():
    rng = np.random.default_rng(1)
    # five columns with well separated means: ranks are certain, the halves agree
    x = rng.normal(size=(80, 5)) * 0.1 + np.array([5, 4, 3, 2, 1])
    lo, hi = stats.rank_intervals(x, resamples=200, seed=0)
    assert np.array_equal(lo, [1, 2, 3, 4, 5]) and np.array_equal(hi, [1, 2, 3, 4, 5])
    assert stats.kendall_tau_halves(x, seed=0) == pytest.approx(1.0)
    # pure noise: wide intervals
    y = rng.normal(size=(20, 5))
    lo, hi = stats.rank_intervals(y, resamples=200, seed=0)
    assert np.all(hi - lo >= 1)
