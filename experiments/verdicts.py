"""Repetitions and verdicts with uncertainty: what every figure's summary says about its numbers.

A repetition is one interleaved pass over a sweep (``harness.sweep.schedule``), so per-repetition medians of two
options were measured under the same load and their ratio is paired. Every reported number is the median of
repetition medians with a 95% bootstrap interval over repetitions (:class:`Spread`); a claim whose interval
straddles its threshold is "not resolved here".
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from harness import stats


def repeat_medians(ok: pd.DataFrame, keys: list[str], value: str = "total_ms", agg: str = "median") -> pd.Series:
    """Median (or ``agg``) of ``value`` over all ranks' measured iterations of one repetition, per ``keys`` and
    ``repeat`` (rows stored before repetitions existed count as repetition 0)."""
    repeat = ok["repeat"].fillna(0).astype(int) if "repeat" in ok.columns else 0
    return ok.assign(repeat=repeat).groupby([*keys, "repeat"])[value].agg(agg)


class Spread(NamedTuple):
    """The median of repetition medians with its 95% bootstrap interval over ``n`` repetitions."""

    center: float
    lo: float
    hi: float
    n: int

    def fmt(self, unit: str = " ms", digits: int = 0) -> str:
        value = f"{self.center:.{digits}f}{unit}"
        if self.n < 2:
            return f"{value} (1 repetition: no spread)"
        return f"{value} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


class Claim(NamedTuple):
    """One number the paper states (or a shape it claims, ``paper=None``) beside what was measured here."""

    figure: str
    what: str
    unit: str  # "%" or "x"
    paper: float | None
    measured: Spread


def spread(per_repeat) -> Spread:
    x = np.asarray(per_repeat, dtype=float)
    lo, hi = stats.bootstrap_median_ci(x, np.random.default_rng(0))
    return Spread(float(np.median(x)), lo, hi, len(x))


def paired_ratios(per_repeat: pd.Series, option, reference) -> np.ndarray:
    """``option`` / ``reference`` within each repetition both have (a repetition is one interleaved pass, so
    the two were measured under the same load)."""
    a, b = per_repeat.xs(option), per_repeat.xs(reference)
    both = a.index.intersection(b.index)
    return (a[both] / b[both]).to_numpy()


def best_options(per_repeat: pd.Series) -> tuple[object, list]:
    """The option (first index level) with the lowest median latency, and every option not worse than it beyond
    the noise: the 95% interval of its per-repetition ratio to the best reaches 1 + the noise, the half-width
    of the best's own interval over repetitions relative to its median (a difference smaller than the spread
    between repetitions is not resolved). With one repetition there is no noise to judge by: only the best."""
    center = per_repeat.groupby(level=0).median()
    best = center.idxmin()
    mine = spread(per_repeat.xs(best))
    noise = (mine.hi - mine.lo) / 2 / mine.center
    tied = [o for o in center.index
            if o == best or spread(paired_ratios(per_repeat, o, best)).lo <= 1.0 + noise]
    return best, tied


def verdict(measured: Spread, threshold: float) -> str:
    """Whether a measured value clears a claimed threshold (the claim: value > threshold), given its spread."""
    if measured.n < 2:
        return "not resolved here: 1 repetition, no spread measured"
    if measured.lo > threshold:
        return "holds here"
    if measured.hi < threshold:
        return "does not hold here"
    return "not resolved here: inside the spread between repetitions"
