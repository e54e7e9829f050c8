"""Every repetition drawn beside the pooled spread: latency boxes of all iterations with a line per repetition over
them, and curves with their percentile band and a dot per repetition's median. The pooled spread alone mixes the
drift between repetitions into it; the repetitions show it apart. Re-exported by ``experiments.plotting``."""

from __future__ import annotations

import pandas as pd

from experiments import verdicts

BOXES_NOTE = ". Grey boxes: all iterations pooled; lines: a repetition each"  # + how its latencies are paired
BOX_COLOR = "0.72"  # the pooled boxes: behind the repetitions' lines, which are what the verdicts compare


def latency_boxes(ax, sel: pd.DataFrame, column: str, label=str, reference=None) -> None:
    """Per value of ``column``: every rank's measured iterations of all repetitions pooled in a light box (whiskers
    1.5 IQR, iterations beyond them not drawn), and over them a line per repetition (:func:`repeat_dots`): with a
    ``reference`` option, :func:`paired_latencies` (what the verdicts compare, in ms), else each repetition's
    median. The pooled boxes mix the drift between repetitions, and between the rank tasks of one repetition, into
    the spread, so they can rank two options the other way round from their paired comparison; the lines cannot.
    See BOXES_NOTE, for the caption."""
    options = sorted(sel[column].unique())
    grey = dict(color=BOX_COLOR)
    ax.boxplot(
        [sel.loc[sel[column] == o, "total_ms"] for o in options],
        tick_labels=[label(o) for o in options],
        showfliers=False,
        widths=0.45,
        boxprops=grey,
        whiskerprops=grey,
        capprops=grey,
        medianprops=dict(color=BOX_COLOR, lw=1.5),
        zorder=1,
    )
    if reference is None:
        repeat_dots(ax, verdicts.repeat_medians(sel, [column]), options, "median of")
    else:
        repeat_dots(
            ax,
            paired_latencies(verdicts.task_medians(sel, [column]), reference),
            options,
            f"paired to {label(reference)}",
        )
    ax.set_ylabel("per-iteration latency (ms)")
    ax.grid(axis="y", alpha=0.3)


def paired_latencies(per_task: pd.Series, reference) -> pd.Series:
    """Per (option, repetition): the reference's median latency in that repetition times the option's paired ratio to
    it there (``verdicts.paired_ratios``): each repetition's latencies as its paired comparisons order them, in ms.
    An option's plain repetition median can come from another rank task than the reference's, measured minutes
    apart, and so differ from the reference by the machine's drift as much as by the option."""
    ref_ms = verdicts.per_repeat(per_task).xs(reference)
    out = {}
    for repeat, tasks in per_task.groupby(level="repeat"):
        if repeat not in ref_ms.index:
            continue
        for option in tasks.index.unique(level=0):
            ratio = verdicts.paired_ratios(tasks, option, reference)
            if len(ratio):
                out[option, repeat] = ref_ms[repeat] * ratio[0]
    return pd.Series(out, dtype=float).rename_axis([per_task.index.names[0], "repeat"])


def repeat_dots(ax, per_repeat: pd.Series, options: list, what: str = "median of") -> None:
    """A value per option (positions 1..n) and repetition (``per_repeat``, indexed by option and ``repeat``), its
    dots joined by a line per repetition and drawn over the boxes: the spread between repetitions beside the spread
    within them, and within each repetition which option was faster. ``what`` heads the legend."""
    if not len(per_repeat):
        return
    table = per_repeat.unstack("repeat").reindex(options)  # option x repetition
    for j, repeat in enumerate(table.columns):
        ax.plot(
            range(1, len(options) + 1),
            table[repeat].to_numpy(dtype=float),
            "-o",
            ms=3.5,
            lw=1,
            alpha=0.85,
            color=f"C{j % 10}",
            zorder=3,
            label=f"repetition {int(repeat) + 1}",
        )
    ax.legend(fontsize=6.5, loc="upper right", title=what, title_fontsize=6.5)


def repeat_markers(ax, sel: pd.DataFrame, keys: list[str], x: str) -> None:
    """Each repetition's median per ``keys`` as a dot at its ``x`` (one of ``keys``), over lines drawn by
    :func:`median_lines`: the spread between repetitions beside the band within them."""
    per_repeat = verdicts.repeat_medians(sel, keys)
    ax.plot(
        per_repeat.index.get_level_values(x),
        per_repeat.values,
        "o",
        ms=3,
        color="C3",
        alpha=0.8,
        label="median of one repetition",
    )


def median_lines(ax, df: pd.DataFrame, x: str, y: str, hue: str, label=str, agg: str = "median") -> None:
    """One line per ``hue`` value: ``agg`` of ``y`` at each ``x``, with the 10th-90th percentile band."""
    for key, sel in df.groupby(hue, sort=True):
        g = sel.groupby(x)[y]
        center = g.mean() if agg == "mean" else g.median()
        (line,) = ax.plot(center.index, center.values, marker="o", label=label(key))
        ax.fill_between(
            center.index, g.quantile(0.1).values, g.quantile(0.9).values, alpha=0.15, color=line.get_color()
        )
    ax.grid(alpha=0.3)
