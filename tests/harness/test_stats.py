"""Bootstrap intervals of medians, ratios of medians and pooled points (experiments.stats), on small arrays."""

import numpy as np
import pytest

from experiments.stats import bootstrap_median_ci, bootstrap_medians, pooled_geomean_ci, ratio_of_medians_ci


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_median_ci_contains_the_sample_median_and_shrinks_with_more_samples():
    data = _rng(1).lognormal(mean=0.0, sigma=0.3, size=400)
    few, many = data[:25], data
    lo, hi = bootstrap_median_ci(few, _rng())
    assert lo <= np.median(few) <= hi and lo < hi
    lo_many, hi_many = bootstrap_median_ci(many, _rng())
    assert lo_many <= np.median(many) <= hi_many
    assert hi_many - lo_many < (hi - lo) / 2  # 16x the samples: about a quarter of the width


def test_median_ci_level_and_constant_samples():
    x = _rng(2).normal(100, 10, size=60)
    narrow, wide = bootstrap_median_ci(x, _rng(), level=0.5), bootstrap_median_ci(x, _rng(), level=0.99)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]
    assert bootstrap_median_ci(np.full(7, 3.5), _rng()) == (3.5, 3.5)
    assert bootstrap_medians([1.0, 2.0, 3.0], _rng(), n=50).shape == (50,)


def test_ratio_of_medians_resamples_pairs_together():
    """b = 2a exactly per pair: every resample's ratio is 1/2, however spread a is."""
    a = _rng(3).uniform(1, 10, size=30)
    assert ratio_of_medians_ci(a, 2 * a, _rng()) == pytest.approx((0.5, 0.5))
    noisy = 2 * a * _rng(4).uniform(0.9, 1.1, size=30)
    lo, hi = ratio_of_medians_ci(a, noisy, _rng())
    assert lo <= np.median(a) / np.median(noisy) <= hi and lo < hi
    with pytest.raises(ValueError, match="equal lengths"):
        ratio_of_medians_ci(a, a[:-1], _rng())


def test_pooled_geomean():
    x = _rng(5).uniform(0.9, 1.2, size=20)
    est, lo, hi = pooled_geomean_ci([x, x.copy(), x.copy()], _rng())
    assert est == pytest.approx(np.median(x)) and lo <= est <= hi  # identical points pool to their median
    est, lo, hi = pooled_geomean_ci([np.full(9, 1.1), np.full(9, 1 / 1.1)], _rng())
    assert (est, lo, hi) == pytest.approx((1.0, 1.0, 1.0))  # +10 % and -10 % (geometrically) cancel
    wider = pooled_geomean_ci([x], _rng())
    narrower = pooled_geomean_ci([x, x[::-1].copy(), _rng(6).permutation(x)], _rng())
    assert narrower[2] - narrower[1] < wider[2] - wider[1]  # more points, each resampled on its own
    with pytest.raises(ValueError, match="no points"):
        pooled_geomean_ci([], _rng())
