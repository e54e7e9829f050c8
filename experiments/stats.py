"""Bootstrap confidence intervals of medians, of ratios of medians, and of several points pooled.

Latencies on a shared machine are skewed and drift, so the suite reports medians with percentile-bootstrap
intervals (resample the iterations or rounds with replacement, take the median of each resample, read the
interval off their quantiles) instead of means with normal-theory errors. Several points (e.g. the bucket
caps of one model) pool into one number by the geometric mean of their medians, each point resampled on its
own, so a ratio of 1.1 at one point and 1/1.1 at another pools to 1.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

N_BOOT = 2000  # resamples per interval


def bootstrap_medians(x, rng: np.random.Generator, n: int = N_BOOT) -> np.ndarray:
    """Medians of ``n`` resamples of ``x`` (with replacement, each the size of ``x``)."""
    x = np.asarray(x, dtype=float)
    return np.median(x[rng.integers(0, len(x), size=(n, len(x)))], axis=1)


def _interval(boot: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return float(lo), float(hi)


def bootstrap_median_ci(x, rng: np.random.Generator, n: int = N_BOOT, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``x``."""
    return _interval(bootstrap_medians(x, rng, n), level)


def ratio_of_medians_ci(a, b, rng: np.random.Generator, n: int = N_BOOT, level: float = 0.95) -> tuple[float, float]:
    """Interval of median(a) / median(b) for paired samples (``a[i]`` and ``b[i]`` measured together, e.g. in
    one round): pairs are resampled together, so load that moved both does not widen the interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    idx = rng.integers(0, len(a), size=(n, len(a)))
    return _interval(np.median(a[idx], axis=1) / np.median(b[idx], axis=1), level)


def pooled_geomean_ci(
    samples: Sequence, rng: np.random.Generator, n: int = N_BOOT, level: float = 0.95
) -> tuple[float, float, float]:
    """(estimate, lo, hi): the geometric mean over points of each point's median (of positive values, e.g.
    ratios), with the interval from resampling each point's samples on its own."""
    if not len(samples):
        raise ValueError("no points to pool")
    estimate = float(np.exp(np.mean([np.log(np.median(x)) for x in samples])))
    boot = np.exp(np.mean([np.log(bootstrap_medians(x, rng, n)) for x in samples], axis=0))
    return (estimate, *_interval(boot, level))
