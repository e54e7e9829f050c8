"""Repetitions and verdicts with uncertainty: what every figure's summary says about its numbers.

A repetition is one pass over a sweep (``harness.sweep.schedule``). Within it, points that differ only in how DDP
trains (bucket cap, overlap, n, k, ...) are measured in one rank task, an iteration of each in turn
(``harness.sweep.interleaved_groups``), so the machine's drift hits them alike and the ratio of two points'
medians in one task is paired. Every reported number is the median over repetitions with a 95% bootstrap
interval over repetitions (:class:`Spread`); a claim whose interval straddles its threshold is "not resolved
here".
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from harness import stats

EQUIVALENT = 0.05  # a setting within 5% of the best counts as tied with it (rank_options)


def task_medians(ok: pd.DataFrame, keys: list[str], value: str = "total_ms", agg: str = "median") -> pd.Series:
    """Median (or ``agg``) of ``value`` over all ranks' measured iterations per ``keys``, ``repeat`` and ``task``
    (the rows' ``group``: the rank task that measured them; rows stored before groups existed count as their
    own task, and as repetition 0 before repetitions existed)."""
    repeat = ok["repeat"].fillna(0).astype(int) if "repeat" in ok.columns else 0
    task = ok["group"].where(ok["group"] != "", ok["point_id"]) if "group" in ok.columns else ok["point_id"]
    return ok.assign(repeat=repeat, task=task).groupby([*keys, "repeat", "task"])[value].agg(agg)


def repeat_medians(ok: pd.DataFrame, keys: list[str], value: str = "total_ms", agg: str = "median") -> pd.Series:
    """Per ``keys`` and ``repeat``: :func:`task_medians` (the median of them for an anchor measured in several)."""
    return per_repeat(task_medians(ok, keys, value, agg))


def per_repeat(per_task: pd.Series) -> pd.Series:
    """A :func:`task_medians` series with its tasks folded: the median over an option's tasks per repetition."""
    if "task" not in per_task.index.names:
        return per_task
    return per_task.groupby(level=[n for n in per_task.index.names if n != "task"]).median()


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


def paired_ratios(per_task: pd.Series, option, reference) -> np.ndarray:
    """``option`` / ``reference`` (first index level) per repetition both have, from :func:`task_medians`: measured
    in one task, the ratio of their medians there; in two tasks of one repetition, through a third option both
    tasks measured (the anchor of ``harness.sweep.interleaved_groups``); otherwise (measured apart, or a series
    without tasks) the ratio of their repetition medians."""
    if "task" not in per_task.index.names:
        a, b = per_task.xs(option), per_task.xs(reference)
        both = a.index.intersection(b.index)
        return (a[both] / b[both]).to_numpy()
    table = per_task.unstack(0)  # (repeat, task) x option
    ratios = []
    for _, tasks in table.groupby(level="repeat"):
        column = {o: tasks.iloc[:, i] for i, o in enumerate(tasks.columns)}  # options may be booleans: no masks
        if column[option].notna().any() and column[reference].notna().any():
            ratios.append(_ratio_in_repeat(column, option, reference))
    return np.asarray(ratios)


def _ratio_in_repeat(column: dict, option, reference) -> float:
    def median_ratio(a, b):
        both = column[a].notna() & column[b].notna()
        return float(np.median(column[a][both] / column[b][both])) if both.any() else None

    direct = median_ratio(option, reference)
    if direct is not None:
        return direct
    for anchor in [a for a in column if a not in (option, reference)]:
        via_o, via_r = median_ratio(option, anchor), median_ratio(reference, anchor)
        if via_o is not None and via_r is not None:
            return via_o / via_r
    return float(column[option].median() / column[reference].median())


def levels(per_task: pd.Series) -> pd.Series:
    """Each option's median paired ratio (:func:`paired_ratios`) to the option fastest in absolute terms: their
    order, unlike absolute medians, does not move with the drift of the tasks that measured them."""
    reference = per_repeat(per_task).groupby(level=0).median().idxmin()
    options = per_task.index.unique(level=0)
    return pd.Series([float(np.median(paired_ratios(per_task, o, reference))) for o in options], index=options)


class Ranking(NamedTuple):
    """Options against the best, by the 95% interval of their paired ratio to it (over repetitions): ``tied``
    (the best included) lies within 1 + :data:`EQUIVALENT`, ``worse`` beyond it, ``unresolved`` straddles it. Two
    runs agree within their uncertainty when no option is tied in one and worse in the other."""

    best: object
    tied: list
    unresolved: list
    worse: list

    @property
    def not_worse(self) -> list:
        return sorted(self.tied + self.unresolved)


def rank_options(per_task: pd.Series) -> Ranking:
    """The option (first index level) with the lowest :func:`levels`, and every option classed against it
    (:class:`Ranking`). Differences under :data:`EQUIVALENT` are not ones to choose a setting by, and a 10-minute
    run on this machine does not resolve them (REPRODUCTION.md, fig 7 notes)."""
    level = levels(per_task)
    best = level.idxmin()
    classes: dict[str, list] = {"tied": [], "unresolved": [], "worse": []}
    for option in sorted(level.index):
        ratio = spread(paired_ratios(per_task, option, best))
        kind = ("tied" if option == best or ratio.hi <= 1 + EQUIVALENT else
                "worse" if ratio.lo > 1 + EQUIVALENT else "unresolved")
        classes[kind].append(option)
    return Ranking(best, **classes)


def verdict(measured: Spread, threshold: float) -> str:
    """Whether a measured value clears a claimed threshold (the claim: value > threshold), given its spread."""
    if measured.n < 2:
        return "not resolved here: 1 repetition, no spread measured"
    if measured.lo > threshold:
        return "holds here"
    if measured.hi < threshold:
        return "does not hold here"
    return "not resolved here: inside the spread between repetitions"
