"""Figure 10: skipping gradient synchronization with no_sync, every n = 1, 2, 4, 8 iterations (Section 5.4).

    make fig10                                  CPU default: Gloo, 2 and 4 ranks (~7 min + setup)
    make fig10 ARGS="--sync_every=1,4 --world_sizes=2"
    torchrun ... -m experiments fig10 --world_sizes=32 --profile=paper

Average per-iteration latency (mean over all measured iterations, synchronized or not, so communication is
amortized over n iterations) vs number of ranks, one line per n. ``iters`` should be a multiple of every n.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments import common
from harness import TrainConfig

FIGURE = "fig10"
PAPER = {
    "setup": "ResNet50 and BERT, NCCL and Gloo, up to 256 GPUs",
    "claim": "synchronizing every n iterations significantly reduces the average (amortized) latency",
}


@dataclass(frozen=True)
class Config:
    """no_sync sweep; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")
    backends: tuple[str, ...] = ("gloo", "nccl")
    world_sizes: tuple[int, ...] = (2, 4)
    sync_every: tuple[int, ...] = (1, 2, 4, 8)
    bucket_cap_mb: float = 25
    impl: str = "ours"
    profile: str = "auto"
    iters: int = 8
    warmup: int = 2
    net: str = "auto"  # emulated link per rank on CPU-only machines (harness/README.md); loopback = none


def points(cfg: Config) -> list[TrainConfig]:
    out = []
    for ws in cfg.world_sizes:
        backends, _ = common.split_backends(cfg.backends, ws)
        out += [TrainConfig(model=m, impl=cfg.impl, profile=cfg.profile, backend=b, world_size=ws,
                            bucket_cap_mb=cfg.bucket_cap_mb, sync_every=n, iters=cfg.iters, warmup=cfg.warmup,
                            net=cfg.net)
                for m in cfg.models for b in backends for n in cfg.sync_every]
    return out


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, synced_only=False, net=cfg.net)  # amortized: no_sync iterations count too
    return ok[ok["model"].isin(cfg.models) & ok["sync_every"].isin(cfg.sync_every)
              & (ok["bucket_cap_mb"] == cfg.bucket_cap_mb)]


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    _, unavailable = common.split_backends(cfg.backends, max(cfg.world_sizes))

    def draw(ax, sel, model, backend):
        common.median_lines(ax, sel, "world_size", "total_ms", "sync_every", label=lambda n: f"n = {n}", agg="mean")
        ax.set_ylim(bottom=0)
        ax.set_xticks(sorted(int(n) for n in sel["world_size"].unique()))
        ax.set_xlabel("ranks")
        ax.set_ylabel("average latency per iteration (ms)")
        ax.legend(fontsize=8, title="sync every", title_fontsize=8)

    fig = common.model_backend_panels(ok, cfg.models, cfg.backends, unavailable, draw)
    common.title(fig, "Figure 10: skipping gradient synchronization", f"{PAPER['setup']}; {PAPER['claim']}")
    common.caption(fig, common.describe_setup(ok))
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    return fig


def summarize(df, cfg: Config) -> str:
    mean = _selected(df, cfg).groupby(["model", "backend", "world_size", "sync_every"])["total_ms"].mean()
    lines = []
    for (model, backend, ws), s in mean.groupby(level=[0, 1, 2]):
        s = s.droplevel([0, 1, 2])
        parts = ", ".join(f"n={n}: {v:.0f} ms" for n, v in s.items())
        if 1 in s.index:
            parts += f" (n={s.index.max()} saves {100 * (1 - s[s.index.max()] / s[1]):.0f}% vs n=1)"
        lines.append(f"{model}/{backend}, {ws} ranks: {parts}")
    return "\n".join(lines) or "no results"
