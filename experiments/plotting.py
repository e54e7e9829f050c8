"""How the figures are drawn: panels per (model, backend), boxes of iteration latencies with each repetition's
median, the paired statistics the verdicts read (``experiments/verdicts.py``), title and caption with the setup the
rows were measured on, and saving (PNG and PDF, byte for byte the same for the same figure)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from experiments import verdicts  # noqa: E402
from experiments.common import ok_rows  # noqa: E402
from harness.results import figures_dir  # noqa: E402

UNAVAILABLE_COLOR = "0.85"


def grid(rows: list[str], cols: list[str], width: float = 4.2, height: float = 3.2):
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(width * len(cols), height * len(rows)),
                             squeeze=False)
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


def caption(fig, text: str) -> int:
    """A small-print line (or lines) at the bottom of the figure; returns how many lines it took."""
    lines = textwrap.wrap(text, max(60, int(fig.get_figwidth() * 19)))  # ~19 characters per inch at 7 pt
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, color="0.3", ha="left", va="bottom")
    return len(lines)


def finish(fig, text: str, paper: str, rows: pd.DataFrame, note: str = "", unavailable: dict | None = None):
    """The end of every plot: title with the paper's claim, the setup caption (plus ``note`` and why any
    requested backend has no panel); the figure grows by the room they take, so the panels keep their size."""
    title_lines = title(fig, text, paper)
    missing = "".join(f". {why}" for why in (unavailable or {}).values())
    caption_lines = caption(fig, describe_setup(rows) + note + missing)
    top_in, bottom_in = title_lines * 10 * 1.3 / 72 + 0.1, caption_lines * 7 * 1.25 / 72 + 0.1
    height = fig.get_figheight() + top_in + bottom_in  # the panels keep their size
    fig.set_figheight(height)
    fig.tight_layout(rect=(0, bottom_in / height, 1, 1 - top_in / height))
    return fig


def title(fig, text: str, paper: str) -> int:
    """Figure title plus the paper's claim (if any), wrapped to the figure's width (a wider title widens saved figures);
    returns how many lines it took."""
    chars = max(40, int(fig.get_figwidth() * 11))  # ~11 characters per inch at 10 pt
    lines = textwrap.wrap(text, chars) + (textwrap.wrap(f"paper: {paper}", chars) if paper else [])
    fig.suptitle("\n".join(lines), fontsize=10)
    return len(lines)


def describe_setup(df: pd.DataFrame) -> str:
    """Where the numbers come from: device, world sizes, profile, network, threads (for captions)."""
    ok = ok_rows(df, synced_only=False)
    if ok.empty:
        return "no successful points"
    parts = []
    for col, label in (("device_name", "device"), ("world_size", "ranks"), ("profile", "profile"),
                       ("net", "network"), ("net_rate_mbit", "emulated Mbit/s per rank (per host with emulated hosts)"),
                       ("num_threads", "threads/rank"), ("hosts", "emulated hosts"), ("hostname", "host")):
        if col == "hosts" and set(ok.get(col, pd.Series(dtype=float)).dropna()) <= {1}:
            continue  # one host: nothing to say
        if col in ok.columns and ok[col].notna().any():
            values = sorted({f"{v:.0f}" if isinstance(v, float) and v >= 10 else str(v)
                             for v in ok[col].dropna().unique()})
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


BOXES_NOTE = (". Boxes: every rank's measured iterations of all repetitions (whiskers 1.5 IQR; iterations beyond "
              "them are not drawn); dots: each repetition's median")


def latency_boxes(ax, sel: pd.DataFrame, column: str, label=str) -> None:
    """Per value of ``column``, a box of the per-iteration latencies with each repetition's median as a dot
    (see BOXES_NOTE, for the caption)."""
    options = sorted(sel[column].unique())
    ax.boxplot([sel.loc[sel[column] == o, "total_ms"] for o in options], tick_labels=[label(o) for o in options],
               showfliers=False)
    repeat_dots(ax, verdicts.repeat_medians(sel, [column]), options)
    ax.set_ylabel("per-iteration latency (ms)")
    ax.grid(axis="y", alpha=0.3)


def repeat_dots(ax, per_repeat: pd.Series, options: list) -> None:
    """Each repetition's median as a dot over its box (positions 1..n), so the spread between repetitions shows
    beside the spread within them."""
    for i, option in enumerate(options, start=1):
        if option in per_repeat.index.get_level_values(0):
            values = per_repeat.xs(option).to_numpy()
            ax.plot(np.full(len(values), i), values, "o", ms=4, color="C3", alpha=0.8,
                    label="median of one repetition" if i == 1 else None)
    if len(per_repeat):
        ax.legend(fontsize=7, loc="upper right")


PAIRED_HEIGHT = 5.0  # inches per row of panels split by split_panel: the latencies above, the paired panel below


def split_panel(ax, height_ratios=(3, 2)):
    """``ax``'s cell cut into two panels sharing the x axis, (upper, lower): the absolute latencies above, the
    statistic the verdicts read below (:func:`paired_panel`), its x tick labels the only ones drawn."""
    fig, spec = ax.figure, ax.get_subplotspec()
    ax.remove()
    upper_spec, lower_spec = spec.subgridspec(2, 1, height_ratios=height_ratios, hspace=0.06)
    upper = fig.add_subplot(upper_spec)
    lower = fig.add_subplot(lower_spec, sharex=upper)
    upper.tick_params(labelbottom=False)
    return upper, lower


PAIRED_NOTE = ("; below, the paired statistic the verdicts read (experiments/verdicts.py): each repetition's value "
               "as a dot (ratios of points measured in one rank task, or through the point two tasks share), their "
               "median as a square with its 95% interval over repetitions")


def paired_panel(ax, values: dict, positions=None, no_difference: float = 1.0, color: str = "k",
                 label: str | None = "median, 95% interval", dots_label: str | None = "one repetition") -> dict:
    """Per option (``values``: option -> one paired value per repetition, e.g. ``verdicts.paired_ratios``), at
    ``positions`` (default 1..n, where :func:`latency_boxes` puts its boxes): each repetition's value as a dot and
    their median with its 95% interval (``verdicts.spread``, the numbers the summaries print) as a square with a
    bar; a line at ``no_difference``. Returns the Spreads drawn, per option."""
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
    """The caption's key to :func:`ranking_panel`'s marks, for options called ``what`` (e.g. "cap")."""
    return (f"Under each {what}, its verdict against the reference: tied = the whole interval below "
            f"{1 + verdicts.EQUIVALENT:g}x (dashed line), worse = above it, ? = not resolved. The reference is marked "
            f"best when no other {what}'s own paired median says it is faster; where the medians of pairs go round (a "
            f"beats b beats c beats a), no {what} is best and the reference (ref) is the one the others beat by the "
            f"least")


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
