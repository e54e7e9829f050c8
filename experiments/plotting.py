"""How the figures are drawn: panels per (model, backend), a line per repetition over the pooled iterations
(``experiments.plot_repeats``), the paired statistics the verdicts read (``experiments.plot_paired``), title and
caption with the setup the rows were measured on, a layout in which no legend covers data and no tick labels
collide (``experiments.legible``), and saving (PNG and PDF, byte for byte the same for the same figure). The drivers
reach all of it here, as ``plotting.<name>``."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import ok_rows  # noqa: E402
from experiments.legible import tidy  # noqa: E402
from experiments.plot_paired import (  # noqa: E402, F401  (re-exported: the drivers call them as plotting.<name>)
    PAIRED_HEIGHT,
    PAIRED_NOTE,
    drawn_paired,
    paired_panel,
    ranking_note,
    ranking_panel,
    split_panel,
    verdict_marks,
)
from experiments.plot_repeats import (  # noqa: E402, F401  (re-exported, as above)
    BOX_COLOR,
    BOXES_NOTE,
    latency_boxes,
    median_lines,
    paired_latencies,
    repeat_dots,
    repeat_markers,
)
from harness.results import figures_dir  # noqa: E402

UNAVAILABLE_COLOR = "0.85"


def grid(rows: list[str], cols: list[str], width: float = 4.2, height: float | list[float] = 3.2):
    """A figure of ``rows`` x ``cols`` panels, each ``width`` wide and ``height`` tall (or a height per row)."""
    heights = list(height) if isinstance(height, (list, tuple)) else [height] * len(rows)
    fig, axes = plt.subplots(
        len(rows), len(cols), figsize=(width * len(cols), sum(heights)), squeeze=False, height_ratios=heights
    )
    return fig, axes


def shown_backends(backends, unavailable: dict) -> list[str]:
    """The backends that get panels: those this machine runs (why the others are missing goes in the caption,
    see :func:`finish`); all of them if none runs, so the figure still says why it is empty."""
    return [b for b in backends if b not in unavailable] or list(backends)


def model_backend_panels(
    ok: pd.DataFrame, models, backends, unavailable: dict, draw, width: float = 4.2, simulated=None, height: float = 3.2
):
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
    for col, label in (
        ("device_name", "device"),
        ("world_size", "ranks"),
        ("profile", "profile"),
        ("net", "network"),
        ("net_rate_mbit", rate),
        ("num_threads", "threads/rank"),
        ("hosts", "emulated hosts"),
        ("hostname", "host"),
    ):
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
