"""Every figure drawn from the committed reference run is legible, as far as a machine can tell: no legend covers a
point its axes draw, no opaque band or bar is drawn over the points, no two tick labels of an axis overlap, every
title is its own, no text says nan, and no caption runs past three lines. The timeline, which the reference run
does not hold, is drawn from a made-up iteration."""

import contextlib
import io
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from matplotlib.text import Text

from experiments import legible, plotting, registry
from experiments.figures import fig02_allreduce_granularity as fig2
from experiments.tools import timeline
from harness import load_results

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"


def _timeline_figure():
    """Two ranks' iteration of six buckets, the last launched after backward ends (what the legend used to cover)."""
    rows = []
    for rank in (0, 1):
        ready = [40.0 + 12 * b + rank for b in range(6)]
        launch = [r + 1.5 for r in ready]
        times = dict(
            forward_end_ms=30.0,
            backward_start_ms=31.0,
            backward_end_ms=105.0 + rank,
            ready_ms=ready,
            launch_ms=launch,
            done_ms=[x + 9.0 for x in launch],
        )
        rows.append(
            dict(
                rank=rank,
                iteration=3,
                total_ms=120.0 + rank,
                bucket_times_json=json.dumps(times),
                error="",
                device_name="cpu",
                world_size=2,
                profile="cpu",
                net="loopback",
            )
        )
    return timeline.plot(pd.DataFrame(rows), timeline.Config(model="resnet50", bucket_cap_mb=5.0))


@pytest.fixture(scope="module")
def rendered():
    """(figure name -> its matplotlib Figure, what the drawing printed): every figure `python -m experiments plots`
    draws from the reference run (captured before saving) and the timeline."""
    drawn = {}
    printed = io.StringIO()
    mp = pytest.MonkeyPatch()
    mp.setattr(plotting, "save", lambda fig, name, root=None: drawn.setdefault(name, fig) and Path(f"{name}.png"))
    try:
        with contextlib.redirect_stdout(printed):
            for draw in registry.figures(REFERENCE).values():
                draw()
    finally:
        mp.undo()
    drawn["timeline"] = _timeline_figure()
    for fig in drawn.values():
        fig.canvas.draw()
    yield drawn, printed.getvalue()
    for fig in drawn.values():
        plt.close(fig)


@pytest.fixture(scope="module")
def figures(rendered):
    return rendered[0]


def _points(ax) -> np.ndarray:
    """Every data point ``ax`` draws inside its frame, in display coordinates: lines' and errorbars' vertices,
    scatter offsets."""
    parts = [np.empty((0, 2))]
    for line in ax.lines:
        if line.get_visible():
            parts.append(line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float)))
    for c in ax.collections:
        if isinstance(c, PathCollection) and c.get_visible() and len(c.get_offsets()):
            parts.append(c.get_offset_transform().transform(np.asarray(c.get_offsets(), dtype=float)))
        elif isinstance(c, LineCollection) and c.get_visible():
            parts += [c.get_transform().transform(np.asarray(s, dtype=float)) for s in c.get_segments()]
    points = np.vstack(parts)
    points = points[np.isfinite(points).all(axis=1)]
    frame = ax.get_window_extent()
    return points[
        (points[:, 0] >= frame.x0)
        & (points[:, 0] <= frame.x1)
        & (points[:, 1] >= frame.y0)
        & (points[:, 1] <= frame.y1)
    ]


def test_every_figure_is_drawn(figures):
    expected = {
        "fig2",
        "fig6",
        "fig7",
        "fig7-hosts1",
        "fig7-hosts2",
        "fig8",
        "fig9",
        "fig9-hosts1",
        "fig9-hosts2",
        "fig10",
        "fig11",
        "fig12",
        "zero",
        "tune",
        "simval",
        "timeline",
        "claims",
    }
    assert expected <= set(figures), expected - set(figures)


def test_no_legend_covers_a_point_of_its_axes(figures):
    covering = []
    for name, fig in figures.items():
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            box = legend.get_window_extent()
            points = _points(ax)
            inside = (
                (points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0) & (points[:, 1] < box.y1)
            )
            if inside.any():
                covering.append(f"{name}: {ax.get_title() or ax.get_ylabel()!r} ({inside.sum()} points)")
    assert not covering, covering


def _opaque(artist) -> bool:
    colors = artist.get_facecolor()
    colors = [to_rgba(colors)] if isinstance(colors, str) or np.ndim(colors) == 1 else list(colors)
    return (artist.get_alpha() in (None, 1)) and bool(len(colors)) and all(c[3] == 1 for c in colors)


def test_no_opaque_band_or_bar_is_drawn_over_points(figures):
    """Points (markers, scatter) come after every opaque filled area of their axes in the drawing order."""
    over = []
    for name, fig in figures.items():
        for ax in fig.axes:
            children = [a for a in ax.get_children() if a in ax.lines or a in ax.collections or a in ax.patches]
            order = sorted(children, key=lambda a: a.get_zorder())  # matplotlib's own: stable by zorder
            points = [
                i
                for i, a in enumerate(order)
                if isinstance(a, PathCollection)
                or isinstance(a, Line2D)
                and a.get_marker() not in (None, "None", "", " ")
            ]
            filled = [
                i
                for i, a in enumerate(order)
                if not isinstance(a, (Line2D, PathCollection, LineCollection)) and a.get_visible() and _opaque(a)
            ]
            if points and filled and max(filled) > min(points):
                over.append(f"{name}: {ax.get_title() or ax.get_ylabel()!r}")
    assert not over, over


def test_no_two_tick_labels_of_an_axis_overlap(figures):
    tangled = []
    for name, fig in figures.items():
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                labels = legible.drawn_tick_labels(axis)
                if legible.colliding(labels, renderer):
                    tangled.append(f"{name}: {ax.get_title()!r} {axis.axis_name}: {[t.get_text() for t in labels]}")
    assert not tangled, tangled


def test_titles_are_distinct_and_carry_no_internal_tags(figures):
    titles = {name: fig.get_suptitle() for name, fig in figures.items()}
    assert all(titles.values()), titles
    same = {t: [n for n in titles if titles[n] == t] for t in titles.values()}
    assert all(len(names) == 1 for names in same.values()), {t: n for t, n in same.items() if len(n) > 1}
    assert not [n for n, t in titles.items() if re.search(r"\[(likely|confirmed)\]", t)]
    assert "2 emulated hosts" in titles["fig9-hosts2"] and "2 emulated hosts" not in titles["fig9-hosts1"]


def test_no_text_says_nan(rendered):
    figures, printed = rendered
    said = [
        (name, t.get_text())
        for name, fig in figures.items()
        for t in fig.findobj(Text)
        if re.search(r"\bnan\b", t.get_text(), re.IGNORECASE)
    ]
    assert not said, said
    table = printed[printed.index("[claims] reading") :]  # the claims chart's table, where the paper has no number
    assert not re.search(r"\bnan\b", table, re.IGNORECASE), table


def test_captions_take_at_most_three_lines(figures):
    for name, fig in figures.items():
        [caption] = [t for t in fig.findobj(Text) if t.get_gid() == "caption"]
        lines = caption.get_text().splitlines()
        assert 1 <= len(lines) <= plotting.CAPTION_LINES, (name, lines)


def test_captions_give_ranges_not_lists_of_link_rates(figures):
    caption = next(t for t in figures["claims"].findobj(Text) if t.get_gid() == "caption").get_text()
    rates = re.search(r"emulated Mbit/s per rank: ([^;]*)", caption.replace("\n", " ")).group(1)
    assert re.fullmatch(r"\d+-\d+", rates), rates


def test_fig2_draws_the_backward_time_its_summary_prints(figures):
    cfg = registry.stored_config(fig2, REFERENCE)
    printed = fig2.summarize(load_results("fig2", REFERENCE), cfg)
    ms = re.search(r"backward compute \(1 rank\): (\d+) ms", printed).group(1)
    [ax] = [ax for ax in figures["fig2"].axes if ax.get_legend()]
    [label] = [t.get_text() for t in ax.get_legend().get_texts() if "backward on CPU" in t.get_text()]
    assert f"({ms} ms)" in label, (label, printed)
    assert "(k)" not in ax.get_xlabel() and "10k" in [t.get_text() for t in ax.get_xticklabels()]
