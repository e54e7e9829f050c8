"""A legible figure, checked by machine: no legend covers what its axes draw and no two tick labels of an axis
collide. :func:`tidy` moves legends and turns or shrinks tick labels until that holds; the test of every reference
figure reads the same functions (:func:`covered`, :func:`drawn_tick_labels`, :func:`colliding`)."""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.ticker import NullFormatter
from matplotlib.transforms import Bbox

LEGEND_SPOTS = (
    "upper right",
    "upper left",
    "lower left",
    "lower right",
    "center right",
    "center left",
    "upper center",
    "lower center",
)  # tried in turn where a legend covers data
HEADROOM = 0.45  # at most this share of an axes' height is added above the data to make room for its legend


def tidy(fig, passes: int = 4) -> None:
    """Lay ``fig`` out until no legend covers what its axes draw (:func:`covered`: it moves to the first free spot of
    :data:`LEGEND_SPOTS`, else to the top of the axes with the y axis stretched to make room above the data, else
    outside the axes at the right) and no two tick labels of an axis collide (x labels turn upright, then shrink; y
    labels lose the minor ones of a log axis, then shrink). Each fix moves the layout, so it is drawn again until
    nothing changes."""
    for _ in range(passes):
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        changed = False
        for ax in fig.axes:
            changed |= _free_legend(ax, renderer)
            for axis in (ax.xaxis, ax.yaxis):
                changed |= _untangle(axis, renderer)
        if not changed:
            return


def _free_legend(ax, renderer) -> bool:
    legend = ax.get_legend()
    if legend is None or not covered(legend.get_window_extent(renderer), ax, renderer):
        return False
    for spot in LEGEND_SPOTS:
        legend.set_loc(spot)
        if not covered(legend.get_window_extent(renderer), ax, renderer):
            return True
    if _headroom(ax, legend.get_window_extent(renderer).height, renderer):
        for spot in ("upper left", "upper right", "upper center"):
            legend.set_loc(spot)
            if not covered(legend.get_window_extent(renderer), ax, renderer):
                return True
    legend.set_loc("upper left")
    legend.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
    return True


def _headroom(ax, height: float, renderer) -> bool:
    """Stretch ``ax``'s y axis upwards so that its data leaves ``height`` pixels (and a margin) free at the top, where
    that takes at most :data:`HEADROOM` of the axes (linear or log scale); returns whether it did."""
    frame = ax.get_window_extent(renderer).height
    room = (height + 8) / frame
    if room > HEADROOM or ax.get_yscale() not in ("linear", "log") or ax.yaxis_inverted():
        return False
    lo, hi = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(lo, lo * (hi / lo) ** (1 / (1 - room)))
    else:
        ax.set_ylim(lo, lo + (hi - lo) / (1 - room))
    return True


def covered(box: Bbox, ax, renderer) -> bool:
    """Whether ``box`` (display coordinates, e.g. a legend's) covers anything ``ax`` draws inside its frame: a point or
    the line between two (lines, markers, errorbars), a band, a bar or a text."""
    frame = ax.get_window_extent(renderer)
    box = box.padded(1)
    points = _drawn_points(ax)
    inside = points[
        (points[:, 0] >= frame.x0)
        & (points[:, 0] <= frame.x1)
        & (points[:, 1] >= frame.y0)
        & (points[:, 1] <= frame.y1)
    ]
    if (
        len(inside)
        and (
            (inside[:, 0] >= box.x0) & (inside[:, 0] <= box.x1) & (inside[:, 1] >= box.y0) & (inside[:, 1] <= box.y1)
        ).any()
    ):
        return True
    for artist in [*ax.patches, *ax.texts]:
        if artist.get_visible() and (not hasattr(artist, "get_text") or artist.get_text()):
            seen = Bbox.intersection(artist.get_window_extent(renderer), frame)
            if seen is not None and seen.width > 0 and seen.height > 0 and seen.overlaps(box):
                return True
    return any(
        c.get_visible()
        and not isinstance(c, (PathCollection, LineCollection))
        and any(
            path.intersects_bbox(box, filled=True) for path in (p.transformed(c.get_transform()) for p in c.get_paths())
        )
        for c in ax.collections
    )


def _drawn_points(ax) -> np.ndarray:
    """Every point ``ax``'s lines, markers and errorbars draw, in display coordinates, with the segments between
    joined points filled in every few pixels."""
    parts = [np.empty((0, 2))]
    for line in ax.lines:
        if line.get_visible():
            xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
            joined = line.get_linestyle() not in ("None", "none", "", " ")
            parts.append(_densify(xy) if joined else xy)
    for c in ax.collections:
        if not c.get_visible():
            continue
        if isinstance(c, PathCollection) and len(c.get_offsets()):
            parts.append(c.get_offset_transform().transform(np.asarray(c.get_offsets(), dtype=float)))
        elif isinstance(c, LineCollection):
            parts += [_densify(c.get_transform().transform(np.asarray(seg, dtype=float))) for seg in c.get_segments()]
    points = np.vstack(parts)
    return points[np.isfinite(points).all(axis=1)]


def _densify(xy: np.ndarray, step: float = 3.0) -> np.ndarray:
    """The polyline ``xy`` (display coordinates) with a point every ``step`` pixels along each segment."""
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) < 2:
        return xy
    seg = np.diff(xy, axis=0)
    n = np.clip((np.hypot(seg[:, 0], seg[:, 1]) // step).astype(int), 1, 1000)
    which = np.repeat(np.arange(len(seg)), n)
    frac = (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)) / np.repeat(n, n)
    return np.vstack([xy[which] + seg[which] * frac[:, None], xy[-1:]])


def drawn_tick_labels(axis) -> list:
    """The tick labels ``axis`` draws: visible, not empty, at a tick inside the view (major and minor)."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    out = []
    for ticks, locs in (
        (axis.get_major_ticks(len(axis.get_majorticklocs())), axis.get_majorticklocs()),
        (axis.get_minor_ticks(len(axis.get_minorticklocs())), axis.get_minorticklocs()),
    ):
        for tick, loc in zip(ticks, locs):
            for label in (tick.label1, tick.label2):
                if label.get_visible() and label.get_text() and lo - span <= loc <= hi + span:
                    out.append(label)
    return out


def colliding(labels, renderer) -> bool:
    """Whether two of ``labels`` (texts) overlap on screen by more than a pixel each way."""
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
                return True
    return False


def _untangle(axis, renderer) -> bool:
    labels = drawn_tick_labels(axis)
    if not colliding(labels, renderer):
        return False
    minor = set(axis.get_minorticklabels())
    if axis.axis_name == "y" and any(t in minor for t in labels):
        axis.set_minor_formatter(NullFormatter())
        return True
    if axis.axis_name == "x" and any(t.get_rotation() != 90 for t in labels):
        axis.set_tick_params(which="both", rotation=90)
        return True
    size = min(t.get_fontsize() for t in labels)
    if size <= 5:
        return False
    axis.set_tick_params(which="both", labelsize=size - 1)
    return True
