"""``simval.png``: every point's prediction against its measurement, a panel per model with its errors below."""

from __future__ import annotations

import pandas as pd

from experiments import plotting
from experiments.tools.simval_grid import EXPERIMENT
from harness.results import load_results


def plot(out: pd.DataFrame, root=None):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, out["model"].nunique(), figsize=(5.5 * out["model"].nunique(), 6.0), squeeze=False)
    markers = dict(zip(sorted(out["world_size"].unique()), "os^Dv<>"))  # world size: shape; link: color
    colors = {net: f"C{i}" for i, net in enumerate(sorted(out["net"].unique()))}
    for ax, (model, sel) in zip(axes[0], out.groupby("model")):
        _model_panel(ax, model, sel, markers, colors)
    plotting.finish(
        fig,
        "Simulator: predicted vs measured per-iteration latency (ours, Gloo, emulated links)",
        "",
        load_results(EXPERIMENT, root),
        note=". Each marker: one point (cap, overlap, no_sync n or round-robin k), measured right after "
        "the calibration probe of its model, world size and link; below, its error",
    )
    return plotting.save(fig, EXPERIMENT, root)


def _model_panel(ax, model: str, sel: pd.DataFrame, markers: dict, colors: dict) -> None:
    """One model's points: predicted against measured above, the error below; shape by ranks, color by link."""
    upper, lower = plotting.split_panel(ax, height_ratios=(3, 1.6))
    both = sel[["measured_ms", "predicted_ms"]]
    lo, hi = both.min().min() * 0.9, both.max().max() * 1.1
    # the band and the diagonal under the points, the points open so that those on top of each other show
    upper.fill_between(
        [lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.88", lw=0, zorder=1, label="within 5 %"
    )
    upper.plot([lo, hi], [lo, hi], "k--", lw=0.8, zorder=2, label="exact")
    lower.axhspan(-5, 5, color="0.88", lw=0, zorder=1)
    lower.axhline(0, color="k", ls="--", lw=0.8, zorder=2)
    for (ws, net), part in sel.groupby(["world_size", "net"]):
        style = dict(
            marker=markers[ws], s=20, facecolors="none", edgecolors=colors[net], linewidths=1, alpha=0.85, zorder=3
        )
        upper.scatter(part["measured_ms"], part["predicted_ms"], label=f"{ws} ranks, {net}", **style)
        lower.scatter(part["measured_ms"], part["error_pct"], **style)
    upper.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), ylabel="predicted ms / iteration")
    lower.set(xlabel="measured ms / iteration", ylabel="error (%)")
    _plain_log_axes(upper, lower)
    err = sel["error_pct"].abs()
    upper.set_title(
        f"{model}: median |error| {err.median():.1f} %, worst {err.max():.1f} % ({len(sel)} points)", fontsize=10
    )
    upper.legend(fontsize=7, loc="upper left")


def _plain_log_axes(upper, lower) -> None:
    """Log axes read in plain milliseconds, and a light grid on both panels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (upper.xaxis, upper.yaxis, lower.xaxis):  # plain milliseconds at 1, 2, 3, 5 x 10^k
        axis.set_major_locator(LogLocator(subs=(1, 2, 3, 5)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    for a in (upper, lower):
        a.grid(alpha=0.3)
