"""Repetitions and verdicts with uncertainty: what every figure's summary says about its numbers.

A repetition is one pass over a sweep (``harness.sweep_order.schedule``). Within it, points that differ only in how DDP
trains (bucket cap, overlap, n, k, ...) are measured in one rank task, an iteration of each in turn
(``harness.sweep_order.interleaved_groups``), so the machine's drift hits them alike and the ratio of two points'
medians in one task is paired. Every reported number is the median over repetitions with a 95% bootstrap
interval over repetitions (:class:`Spread`); a claim whose interval straddles its threshold is "not resolved
here".
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from experiments import stats

EQUIVALENT = 0.05  # a setting within 5% of the best counts as tied with it (rank_options)
_ROUNDING = 1e-9  # a ratio through an anchor that should be 1 can come out a rounding error below it


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
    tasks measured (the anchor of ``harness.sweep_order.interleaved_groups``); otherwise (measured apart, or a series
    without tasks) the ratio of their repetition medians."""
    if "task" not in per_task.index.names:
        a, b = per_task.xs(option), per_task.xs(reference)
        both = a.index.intersection(b.index)
        return (a[both] / b[both]).to_numpy()
    return _paired(_by_repeat(per_task), option, reference)


def _by_repeat(per_task: pd.Series) -> list[dict]:
    """Per repetition: option -> its medians in that repetition's tasks (NaN in a task that did not measure it)."""
    table = per_task.unstack(0)  # (repeat, task) x option; options may be booleans: columns by position
    return [
        {o: tasks.iloc[:, i].to_numpy(dtype=float) for i, o in enumerate(tasks.columns)}
        for _, tasks in table.groupby(level="repeat")
    ]


def _paired(repeats: list[dict], option, reference) -> np.ndarray:
    return np.asarray(
        [
            _ratio_in_repeat(column, option, reference)
            for column in repeats
            if not np.isnan(column[option]).all() and not np.isnan(column[reference]).all()
        ]
    )


def _ratio_in_repeat(column: dict, option, reference) -> float:
    def median_ratio(a, b):
        both = ~np.isnan(column[a]) & ~np.isnan(column[b])
        return float(np.median(column[a][both] / column[b][both])) if both.any() else None

    direct = median_ratio(option, reference)
    if direct is not None:
        return direct
    for anchor in [a for a in column if a not in (option, reference)]:
        via_o, via_r = median_ratio(option, anchor), median_ratio(reference, anchor)
        if via_o is not None and via_r is not None:
            return via_o / via_r
    return float(np.nanmedian(column[option]) / np.nanmedian(column[reference]))


def median_ratios(per_task: pd.Series) -> pd.DataFrame:
    """Every option's (rows) median :func:`paired_ratios` to every other (columns): the centers a figure draws."""
    options = list(per_task.index.unique(level=0))
    repeats = _by_repeat(per_task) if "task" in per_task.index.names else None  # one unstack for every pair

    def ratios(o, r):
        return _paired(repeats, o, r) if repeats is not None else paired_ratios(per_task, o, r)

    return pd.DataFrame(
        [[float(np.median(ratios(o, r))) if o != r else 1.0 for r in options] for o in options],
        index=options,
        columns=options,
    )


def _says_faster(table: pd.DataFrame, option, reference) -> float:
    """How much faster ``option``'s own paired comparison with ``reference`` says it is, read both ways (``option /
    reference`` and ``1 / (reference / option)``, which differ when an even number of repetitions is averaged):
    below 1, faster."""
    return min(table.loc[option, reference], 1 / table.loc[reference, option])


class Ranking(NamedTuple):
    """Options against ``reference``, by the 95% interval of their paired ratio to it over repetitions
    (``ratios``: a :class:`Spread` per option, the reference's 1): ``tied`` (the reference included) lies within
    1 + :data:`EQUIVALENT`, ``worse`` beyond it, ``unresolved`` straddles it. Two runs agree within their
    uncertainty when no option is tied in one and worse in the other.

    The reference is the best (:attr:`best`) when no option's median paired ratio to it says faster. Medians over
    repetitions are not transitive: the pairs can go round in a cycle (a beats b beats c beats a), and then no
    option is the best; the reference is the option the others beat by the least, and ``faster`` names those
    that beat it."""

    reference: object
    tied: list
    unresolved: list
    worse: list
    faster: list
    ratios: dict

    @property
    def best(self):
        """The reference, where no option's paired comparison with it says faster; None where that is not resolved."""
        return None if self.faster else self.reference

    @property
    def worst(self):
        """The option with the highest median paired ratio to the reference (drawn highest)."""
        return max(self.ratios, key=lambda o: (self.ratios[o].center, self.ratios[o].hi))

    @property
    def not_worse(self) -> list:
        return sorted(self.tied + self.unresolved)


def rank_options(per_task: pd.Series) -> Ranking:
    """Every option (first index level) classed against a reference (:class:`Ranking`): the option whose own paired
    comparison with every other says it is not slower (the lowest absolute median if several), else the one the
    others beat by the least. Never the option with the lowest median ratio to some third option: that one can
    be beaten in its own comparison with another. Differences under :data:`EQUIVALENT` are not ones to choose a
    setting by, and a 10-minute run on this machine does not resolve them (REPRODUCTION.md, fig 7 notes)."""
    table = median_ratios(per_task)
    absolute = per_repeat(per_task).groupby(level=0).median()

    def beaten_by(reference) -> float:  # the lowest "says faster" of another option; 1 where none is below 1
        lowest = min([1.0, *(_says_faster(table, o, reference) for o in table.index if o != reference)])
        return 1.0 if lowest > 1 - _ROUNDING else lowest

    reference = max(table.index, key=lambda r: (beaten_by(r), -absolute[r]))
    faster = sorted(o for o in table.index if o != reference and _says_faster(table, o, reference) < 1 - _ROUNDING)
    classes: dict[str, list] = {"tied": [], "unresolved": [], "worse": []}
    ratios = {}
    for option in sorted(table.index):
        ratios[option] = ratio = spread(paired_ratios(per_task, option, reference))
        kind = (
            "tied"
            if option == reference or ratio.hi <= 1 + EQUIVALENT
            else "worse"
            if ratio.lo > 1 + EQUIVALENT
            else "unresolved"
        )
        classes[kind].append(option)
    return Ranking(reference, **classes, faster=faster, ratios=ratios)


def verdict(measured: Spread, threshold: float) -> str:
    """Whether a measured value clears a claimed threshold (the claim: value > threshold), given its spread."""
    if measured.n < 2:
        return "not resolved here: 1 repetition, no spread measured"
    if measured.lo > threshold:
        return "holds here"
    if measured.hi < threshold:
        return "does not hold here"
    return "not resolved here: inside the spread between repetitions"
