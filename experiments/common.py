"""What every figure driver shares: the driver contract, backend availability, and saving figures.

A driver is a module ``experiments/figNN_<what>.py`` that exposes
    FIGURE = "fig7"                 the experiment name (results/<FIGURE>/, results/figures/<FIGURE>.png)
    Config                          a dataclass of sweep settings; every field is a --key=value override
    PAPER                           the paper's claims for this figure, for the plot and REPRODUCTION.md
    points(cfg) -> list             the harness point configs to measure
    plot(df, cfg) -> Figure         draws the figure from the stored rows alone
    summarize(df, cfg) -> str       optional: one paragraph of measured-vs-claimed numbers
``python -m experiments`` finds drivers by listing this folder (see ``experiments/registry.py``).
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.results import results_root  # noqa: E402

UNAVAILABLE_COLOR = "0.85"


def cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def split_backends(backends, world_size: int) -> tuple[list[str], dict[str, str]]:
    """The requested backends this machine can run at ``world_size``, and why the others cannot."""
    usable, unavailable = [], {}
    gpus = cuda_gpus()
    for b in backends:
        if b == "nccl" and gpus < world_size:
            unavailable[b] = (f"NCCL unavailable here: {gpus} CUDA GPU(s) for {world_size} ranks"
                              " (run on a GPU machine or cluster)")
        else:
            usable.append(b)
    return usable, unavailable


def ok_rows(df: pd.DataFrame, synced_only: bool = True, net: str | None = None) -> pd.DataFrame:
    """Measured rows of successful points (failed points are stored as a single row with ``error``);
    with ``net``, only those measured over that network (see :func:`for_net`)."""
    if df.empty:
        return df
    ok = df[df["error"].fillna("") == ""]
    if synced_only and "synced" in ok.columns:
        ok = ok[ok["synced"].fillna(True).astype(bool)]
    return ok if net is None else for_net(ok, net)


def for_net(df: pd.DataFrame, net: str) -> pd.DataFrame:
    """Rows measured over the network a driver's ``net`` asks for on this machine, so runs with different
    ``--net`` stored side by side are never mixed. ``auto`` also keeps the points where it means loopback
    (NCCL or GPUs, torchrun, one rank, no communication): they are stored with ``net = loopback``."""
    if df.empty or "net" not in df.columns:
        return df
    keep = df["net"] == net
    if net == "auto":
        from harness.config import auto_net_is_loopback

        plain = df[df["net"] == "loopback"].drop_duplicates("point_id")
        same = {r.point_id for r in plain.itertuples()
                if auto_net_is_loopback(r.point_type, r.backend, int(r.world_size),
                                        r.impl if isinstance(getattr(r, "impl", None), str) else "")}
        keep |= df["point_id"].isin(same)
    return df[keep]


def grid(rows: list[str], cols: list[str], width: float = 4.2, height: float = 3.2):
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(width * len(cols), height * len(rows)),
                             squeeze=False)
    return fig, axes


def model_backend_panels(ok: pd.DataFrame, models, backends, unavailable: dict, draw):
    """One panel per (model, backend): ``draw(ax, rows, model, backend)``, or a panel saying why it is empty."""
    fig, axes = grid(list(models), list(backends))
    for r, model in enumerate(models):
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


def caption(fig, text: str) -> None:
    fig.text(0.01, 0.005, textwrap.fill(text, 160), fontsize=7, color="0.3", ha="left", va="bottom")


def title(fig, text: str, paper: str) -> None:
    """Figure title plus the paper's claim, wrapped to the figure's width (a wider title widens saved figures)."""
    chars = max(60, int(fig.get_figwidth() * 14))  # ~14 characters per inch at 10 pt
    fig.suptitle("\n".join([text] + textwrap.wrap(f"paper: {paper}", chars)), fontsize=10)


def describe_setup(df: pd.DataFrame) -> str:
    """Where the numbers come from: device, world sizes, profile, network, threads (for captions)."""
    ok = ok_rows(df, synced_only=False)
    if ok.empty:
        return "no successful points"
    parts = []
    for col, label in (("device_name", "device"), ("world_size", "ranks"), ("profile", "profile"),
                       ("net", "network"), ("net_rate_mbit", "emulated Mbit/s per rank"),
                       ("num_threads", "threads/rank"), ("hostname", "host")):
        if col in ok.columns and ok[col].notna().any():
            values = sorted({f"{v:.0f}" if isinstance(v, float) and v >= 10 else str(v)
                             for v in ok[col].dropna().unique()})
            parts.append(f"{label}: {', '.join(values)}")
    return "; ".join(parts)


def save(fig, name: str, root=None) -> Path:
    """Write ``results/figures/<name>.png`` and ``.pdf``; returns the PNG path."""
    out = results_root(root) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{name}.png"
    fig.savefig(png, dpi=120, bbox_inches="tight")
    fig.savefig(out / f"{name}.pdf", bbox_inches="tight")
    plt.close(fig)
    return png


def fmt_mb(mb: float) -> str:
    return "0" if mb == 0 else (f"{mb:g}" if mb < 1000 else f"{mb / 1000:g}k")


def speedup_pct(slow_ms: float, fast_ms: float) -> float:
    """The paper's speedup convention: (slow - fast) / fast, in percent."""
    return math.nan if not fast_ms else 100.0 * (slow_ms - fast_ms) / fast_ms


def median_lines(ax, df: pd.DataFrame, x: str, y: str, hue: str, label=str, agg: str = "median") -> None:
    """One line per ``hue`` value: ``agg`` of ``y`` at each ``x``, with the 10th-90th percentile band."""
    for key, sel in df.groupby(hue, sort=True):
        g = sel.groupby(x)[y]
        center = g.mean() if agg == "mean" else g.median()
        line, = ax.plot(center.index, center.values, marker="o", label=label(key))
        ax.fill_between(center.index, g.quantile(0.1).values, g.quantile(0.9).values, alpha=0.15,
                        color=line.get_color())
    ax.grid(alpha=0.3)
