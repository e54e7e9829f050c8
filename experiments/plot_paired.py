"""The paired statistics the verdicts read (``experiments/verdicts.py``), drawn: a panel of each option's paired
values per repetition with their median and 95% interval, under the absolute latencies of its cell, and the
ranking of options they give. Re-exported by ``experiments.plotting``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments import verdicts

PAIRED_HEIGHT = 5.0  # inches per row of panels split by split_panel: the latencies above, the paired panel below


def split_panel(ax, height_ratios=(3, 2)):
    """``ax``'s cell cut into two panels sharing the x axis, (upper, lower): the absolute latencies above, the
    statistic the verdicts read below (:func:`paired_panel`), its x tick labels the only ones drawn."""
    fig, spec = ax.figure, ax.get_subplotspec()
    ax.remove()
    upper_spec, lower_spec = spec.subgridspec(2, 1, height_ratios=height_ratios, hspace=0)  # constrained layout pads
    upper = fig.add_subplot(upper_spec)
    lower = fig.add_subplot(lower_spec, sharex=upper)
    upper.tick_params(labelbottom=False)
    return upper, lower


PAIRED_NOTE = "; below, a dot per repetition, median and 95% interval (square)"  # + " of" what


def paired_panel(
    ax,
    values: dict,
    positions=None,
    no_difference: float = 1.0,
    color: str = "k",
    label: str | None = "median, 95% interval",
    dots_label: str | None = "one repetition",
) -> dict:
    """Per option (``values``: option -> one paired value per repetition, e.g. ``verdicts.paired_ratios``), at
    ``positions`` (default 1..n, where ``plot_repeats.latency_boxes`` puts its boxes): each repetition's value as a
    dot and their median with its 95% interval (``verdicts.spread``, the numbers the summaries print) as a square
    with a bar; a line at ``no_difference``. Returns the Spreads drawn, per option.

    The paired statistic is what the verdicts read (``experiments/verdicts.py``): a ratio of points measured in one
    rank task, or through the point two tasks share, so the drift between repetitions cancels (PAIRED_NOTE, for the
    caption)."""
    positions = list(positions) if positions is not None else list(range(1, len(values) + 1))
    drawn = {}
    for i, (x, (option, per_repeat)) in enumerate(zip(positions, values.items())):
        labels = (label, dots_label) if i == 0 else (None, None)
        drawn[option] = _paired_option(ax, x, option, np.asarray(per_repeat, dtype=float), color, *labels)
    ax.axhline(no_difference, color="0.4", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    return drawn


def _paired_option(ax, x, option, per_repeat: np.ndarray, color: str, label, dots_label) -> verdicts.Spread:
    """One option of :func:`paired_panel` at ``x``: the square with its bar (found again by its gid), then the dots."""
    s = verdicts.spread(per_repeat)
    bar = ax.errorbar(
        [x],
        [s.center],
        yerr=[[s.center - s.lo], [s.hi - s.center]],
        fmt="s",
        ms=4,
        color=color,
        capsize=3,
        label=label,
    )
    bar.lines[0].set_gid(f"paired:{option}")  # drawn_paired reads it back
    ax.plot(
        np.full(len(per_repeat), x),
        per_repeat,
        "o",
        ms=3.5,
        mfc="none",
        color=color,
        alpha=0.6,
        label=dots_label,
    )
    return s


def drawn_paired(ax) -> dict:
    """What :func:`paired_panel` drew on ``ax``: option label -> (center, lo, hi), read back from the artists."""
    out = {}
    for container in ax.containers:
        if not hasattr(container, "has_xerr"):  # not an errorbar (e.g. bars)
            continue
        line, _, bars = container.lines
        gid = line.get_gid() or ""
        if gid.startswith("paired:"):
            ((_, center),) = line.get_xydata()
            (_, lo), (_, hi) = bars[0].get_segments()[0]
            out[gid[len("paired:") :]] = (float(center), float(lo), float(hi))
    return out


def ranking_note(what: str) -> str:
    """The caption's key to :func:`ranking_panel`'s marks, for options called ``what`` (e.g. "cap"). At length: tied =
    the whole interval below 1 + EQUIVALENT (the dashed line), worse = the whole interval above it, ? = not resolved.
    The reference is marked best when no other option's own paired median says it is faster; where the medians of
    pairs go round (a beats b beats c beats a), no option is best and the reference (ref) is the one the others beat
    by the least (``verdicts.rank_options``)."""
    return f"; under each {what} its verdict (tied: below {1 + verdicts.EQUIVALENT:g}x, dashed)"


def verdict_marks(ranking: verdicts.Ranking) -> dict:
    """Option -> its verdict under its tick: best (ref where no option is best), tied, ? or worse."""
    return {
        **{o: "tied" for o in ranking.tied},
        **{o: "?" for o in ranking.unresolved},
        **{o: "worse" for o in ranking.worse},
        ranking.reference: "best" if ranking.best is not None else "ref",
    }


def ranking_panel(
    ax, per_task: pd.Series, ranking: verdicts.Ranking, options: list, fmt=str, unit: str = "", positions=None
) -> dict:
    """What ``ranking`` (``verdicts.rank_options(per_task)``) rests on, on ``ax``: each option's paired ratio to the
    reference (:func:`paired_panel`), the margin of a tie (dashed), and under each option its verdict
    (:func:`verdict_marks`; see :func:`ranking_note` for the caption). Returns the Spreads drawn."""
    positions = list(positions) if positions is not None else list(range(1, len(options) + 1))
    drawn = paired_panel(ax, {o: verdicts.paired_ratios(per_task, o, ranking.reference) for o in options}, positions)
    ax.axhline(1 + verdicts.EQUIVALENT, color="C2", ls="--", lw=0.8)
    mark = verdict_marks(ranking)
    ax.set_xticks(positions, [f"{fmt(o)}\n{mark[o]}" for o in options])
    ax.set_ylabel(f"latency / {mark[ranking.reference]}'s\n({fmt(ranking.reference)}{unit}), paired")
    if ranking.best is None:
        ax.text(
            0.02,
            0.96,
            f"no best: {', '.join(fmt(o) + unit for o in ranking.faster)} faster than ref in the paired median",
            transform=ax.transAxes,
            fontsize=6.5,
            va="top",
            color="C3",
        )
    return drawn
