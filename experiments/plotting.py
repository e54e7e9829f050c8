"""How the figures are drawn: panels per (model, backend), a line per repetition over the pooled iterations, the
paired statistics the verdicts read (``experiments/verdicts.py``), title and caption with the setup the rows were
measured on, a layout in which no legend covers data and no tick labels collide (``experiments.legible``), and
saving (PNG and PDF, byte for byte the same for the same figure)."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from experiments import verdicts  # noqa: E402
from experiments.common import ok_rows  # noqa: E402
from experiments.legible import tidy  # noqa: E402
from harness.results import figures_dir  # noqa: E402

UNAVAILABLE_COLOR = "0.85"


def grid(rows: list[str], cols: list[str], width: float = 4.2, height: float | list[float] = 3.2):
    """A figure of ``rows`` x ``cols`` panels, each ``width`` wide and ``height`` tall (or a height per row)."""
    heights = list(height) if isinstance(height, (list, tuple)) else [height] * len(rows)
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(width * len(cols), sum(heights)), squeeze=False,
                             height_ratios=heights)
    return fig, axes


def shown_backends(backends, unavailable: dict) -> list[str]:
    """The backends that get panels: those this machine runs (why the others are missing goes in the caption,
    see :func:`finish`); all of them if none runs, so the figure still says why it is empty."""
    return [b for b in backends if b not in unavailable] or list(backends)


def model_backend_panels(ok: pd.DataFrame, models, backends, unavailable: dict, draw, width: float = 4.2,
                         simulated=None, height: float = 3.2):
    """One panel per (model, shown backend): ``draw(ax, rows, model, backend)``, or a panel saying why it is
    empty; with ``simulated``, one more panel per model at the right: ``simulated(ax, model)``."""
    backends = shown_backends(backends, unavailable)
    fig, axes = grid(list(models), backends + ["simulated"] * bool(simulated), width=width, height=height)
    for r, model in enumerate(models):
        if simulated:
            simulated(axes[r][-1], model)
        for c, backend in enumerate(backends):
            ax = axes[r][c]
            sel = ok[(ok["model"] == model) & (ok["backend"] == backend)]
            if backend in unavailable or sel.empty:
                mark_unavailable(ax, unavailable.get(backend, f"no results for {model} / {backend}"))
                continue
            ax.set_title(f"{model} / {backend}", fontsize=10)
            draw(ax, sel, model, backend)
    return fig


def mark_unavailable(ax, text: str) -> None:
    """A panel that says plainly why it holds no data, instead of leaving it blank or faking it."""
    ax.set_facecolor(UNAVAILABLE_COLOR)
    ax.text(0.5, 0.5, textwrap.fill(text, 40), ha="center", va="center", fontsize=9, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


CAPTION_LINES = 3  # at most: the setup and a key to the marks; what the marks mean at length is in the docstrings
_TAGS = re.compile(r"\s*\([^()]*\[(?:likely|confirmed)\]\)|\s*\[(?:likely|confirmed)\]")  # a remark on the tag, too


def clean(text: str) -> str:
    """``text`` without the ``[likely]`` / ``[confirmed]`` tags the drivers' PAPER dicts carry for REPRODUCTION.md:
    how sure a transcription of the paper is belongs in that document, not in a figure's title."""
    return _TAGS.sub("", text)


def caption(fig, text: str) -> int:
    """A small-print line (or lines) at the bottom of the figure, found again by its gid ``caption``; returns how many
    lines it took (at most :data:`CAPTION_LINES` is what the figures keep to)."""
    lines = textwrap.wrap(clean(text).lstrip(".;, "), max(60, int(fig.get_figwidth() * 19)))  # ~19 chars/inch at 7 pt
    # the figure's x label, so that constrained layout keeps its room below the panels (as the suptitle's above)
    fig.supxlabel("\n".join(lines), x=0.01, ha="left", fontsize=7, color="0.3", gid="caption")
    return len(lines)


def finish(fig, text: str, paper: str, rows: pd.DataFrame, note: str = "", unavailable: dict | None = None):
    """The end of every plot: title with the paper's claim, the setup caption (plus ``note`` and why any
    requested backend has no panel); the figure grows by the room they take, so the panels keep their size. The
    layout is constrained (tick labels and legends outside the axes get their room) and :func:`tidy`."""
    title_lines = title(fig, text, paper)
    missing = "".join(f". {why}" for why in (unavailable or {}).values())
    caption_lines = caption(fig, describe_setup(rows, compact=True) + note + missing)
    top_in, bottom_in = title_lines * 10 * 1.3 / 72 + 0.1, caption_lines * 7 * 1.25 / 72 + 0.1
    height = fig.get_figheight() + top_in + bottom_in  # the panels keep their size
    fig.set_figheight(height)
    fig.set_layout_engine("constrained")  # which keeps the room of the title and the caption
    tidy(fig)
    return fig


def title(fig, text: str, paper: str) -> int:
    """Figure title plus the paper's claim (if any), wrapped to the figure's width (a wider title widens saved figures);
    returns how many lines it took."""
    chars = max(40, int(fig.get_figwidth() * 11))  # ~11 characters per inch at 10 pt
    text, paper = clean(text), clean(paper)
    lines = textwrap.wrap(text, chars) + (textwrap.wrap(f"paper: {paper}", chars) if paper else [])
    fig.suptitle("\n".join(lines), fontsize=10)
    return len(lines)


def describe_setup(df: pd.DataFrame, compact: bool = False) -> str:
    """Where the numbers come from: device, world sizes, profile, network, threads (for reports). ``compact``, for
    captions: more than three numbers as their range, shorter labels, and "nothing measured" for no rows at all."""
    if compact and df.empty:
        return "nothing measured"
    ok = ok_rows(df, synced_only=False)
    if ok.empty:
        return "no successful points"
    several_hosts = not set(ok.get("hosts", pd.Series(dtype=float)).dropna()) <= {1}
    rate = "emulated Mbit/s per rank (per host with emulated hosts)"
    if compact:
        rate = "emulated Mbit/s per rank" + (" (per host)" if several_hosts else "")
    parts = []
    for col, label in (("device_name", "device"), ("world_size", "ranks"), ("profile", "profile"),
                       ("net", "network"), ("net_rate_mbit", rate),
                       ("num_threads", "threads/rank"), ("hosts", "emulated hosts"), ("hostname", "host")):
        if col == "hosts" and not several_hosts:
            continue  # one host: nothing to say
        if col in ok.columns and ok[col].notna().any():
            unique = ok[col].dropna().unique()
            if compact and len(unique) > 3 and pd.api.types.is_numeric_dtype(ok[col]):
                parts.append(f"{label}: {unique.min():.0f}-{unique.max():.0f}")
                continue
            values = sorted({f"{v:.0f}" if isinstance(v, float) and v >= 10 else str(v) for v in unique})
            parts.append(f"{label}: {', '.join(values)}")
    return "; ".join(parts)


def save(fig, name: str, root=None) -> Path:
    """Write ``results/figures/<name>.png`` and ``.pdf`` (elsewhere as :func:`harness.results.figures_dir` says);
    returns the PNG path. Both files depend on the figure only (no creation date), so a redraw of unchanged
    results leaves them byte for byte as they were."""
    out = figures_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{name}.png"
    fig.savefig(png, dpi=120, bbox_inches="tight")
    fig.savefig(out / f"{name}.pdf", bbox_inches="tight", metadata={"CreationDate": None})
    plt.close(fig)
    return png


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
    ax.boxplot([sel.loc[sel[column] == o, "total_ms"] for o in options], tick_labels=[label(o) for o in options],
               showfliers=False, widths=0.45, boxprops=grey, whiskerprops=grey, capprops=grey,
               medianprops=dict(color=BOX_COLOR, lw=1.5), zorder=1)
    if reference is None:
        repeat_dots(ax, verdicts.repeat_medians(sel, [column]), options, "median of")
    else:
        repeat_dots(ax, paired_latencies(verdicts.task_medians(sel, [column]), reference), options,
                    f"paired to {label(reference)}")
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
        ax.plot(range(1, len(options) + 1), table[repeat].to_numpy(dtype=float), "-o", ms=3.5, lw=1, alpha=0.85,
                color=f"C{j % 10}", zorder=3, label=f"repetition {int(repeat) + 1}")
    ax.legend(fontsize=6.5, loc="upper right", title=what, title_fontsize=6.5)


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


def paired_panel(ax, values: dict, positions=None, no_difference: float = 1.0, color: str = "k",
                 label: str | None = "median, 95% interval", dots_label: str | None = "one repetition") -> dict:
    """Per option (``values``: option -> one paired value per repetition, e.g. ``verdicts.paired_ratios``), at
    ``positions`` (default 1..n, where :func:`latency_boxes` puts its boxes): each repetition's value as a dot and
    their median with its 95% interval (``verdicts.spread``, the numbers the summaries print) as a square with a
    bar; a line at ``no_difference``. Returns the Spreads drawn, per option.

    The paired statistic is what the verdicts read (``experiments/verdicts.py``): a ratio of points measured in one
    rank task, or through the point two tasks share, so the drift between repetitions cancels (PAIRED_NOTE, for the
    caption)."""
    positions = list(positions) if positions is not None else list(range(1, len(values) + 1))
    drawn = {}
    for i, (x, (option, per_repeat)) in enumerate(zip(positions, values.items())):
        per_repeat = np.asarray(per_repeat, dtype=float)
        drawn[option] = s = verdicts.spread(per_repeat)
        bar = ax.errorbar([x], [s.center], yerr=[[s.center - s.lo], [s.hi - s.center]], fmt="s", ms=4,
                          color=color, capsize=3, label=label if i == 0 else None)
        bar.lines[0].set_gid(f"paired:{option}")  # drawn_paired reads it back
        ax.plot(np.full(len(per_repeat), x), per_repeat, "o", ms=3.5, mfc="none", color=color, alpha=0.6,
                label=dots_label if i == 0 else None)
    ax.axhline(no_difference, color="0.4", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    return drawn


def drawn_paired(ax) -> dict:
    """What :func:`paired_panel` drew on ``ax``: option label -> (center, lo, hi), read back from the artists."""
    out = {}
    for container in ax.containers:
        if not hasattr(container, "has_xerr"):  # not an errorbar (e.g. bars)
            continue
        line, _, bars = container.lines
        gid = line.get_gid() or ""
        if gid.startswith("paired:"):
            (_, center), = line.get_xydata()
            (_, lo), (_, hi) = bars[0].get_segments()[0]
            out[gid[len("paired:"):]] = (float(center), float(lo), float(hi))
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
    return {**{o: "tied" for o in ranking.tied}, **{o: "?" for o in ranking.unresolved},
            **{o: "worse" for o in ranking.worse}, ranking.reference: "best" if ranking.best is not None else "ref"}


def ranking_panel(ax, per_task: pd.Series, ranking: verdicts.Ranking, options: list, fmt=str, unit: str = "",
                  positions=None) -> dict:
    """What ``ranking`` (``verdicts.rank_options(per_task)``) rests on, on ``ax``: each option's paired ratio to the
    reference (:func:`paired_panel`), the margin of a tie (dashed), and under each option its verdict
    (:func:`verdict_marks`; see :func:`ranking_note` for the caption). Returns the Spreads drawn."""
    positions = list(positions) if positions is not None else list(range(1, len(options) + 1))
    drawn = paired_panel(ax, {o: verdicts.paired_ratios(per_task, o, ranking.reference) for o in options},
                         positions)
    ax.axhline(1 + verdicts.EQUIVALENT, color="C2", ls="--", lw=0.8)
    mark = verdict_marks(ranking)
    ax.set_xticks(positions, [f"{fmt(o)}\n{mark[o]}" for o in options])
    ax.set_ylabel(f"latency / {mark[ranking.reference]}'s\n({fmt(ranking.reference)}{unit}), paired")
    if ranking.best is None:
        ax.text(0.02, 0.96, f"no best: {', '.join(fmt(o) + unit for o in ranking.faster)} faster than ref in "
                f"the paired median", transform=ax.transAxes, fontsize=6.5, va="top", color="C3")
    return drawn


def repeat_markers(ax, sel: pd.DataFrame, keys: list[str], x: str) -> None:
    """Each repetition's median per ``keys`` as a dot at its ``x`` (one of ``keys``), over lines drawn by
    :func:`median_lines`: the spread between repetitions beside the band within them."""
    per_repeat = verdicts.repeat_medians(sel, keys)
    ax.plot(per_repeat.index.get_level_values(x), per_repeat.values, "o", ms=3, color="C3", alpha=0.8,
            label="median of one repetition")


def median_lines(ax, df: pd.DataFrame, x: str, y: str, hue: str, label=str, agg: str = "median") -> None:
    """One line per ``hue`` value: ``agg`` of ``y`` at each ``x``, with the 10th-90th percentile band."""
    for key, sel in df.groupby(hue, sort=True):
        g = sel.groupby(x)[y]
        center = g.mean() if agg == "mean" else g.median()
        line, = ax.plot(center.index, center.values, marker="o", label=label(key))
        ax.fill_between(center.index, g.quantile(0.1).values, g.quantile(0.9).values, alpha=0.15,
                        color=line.get_color())
    ax.grid(alpha=0.3)
