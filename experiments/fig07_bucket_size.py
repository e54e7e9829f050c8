"""Figure 7: per-iteration latency vs gradient bucket size (paper Section 5.2, 16 GPUs).

    make fig7                                   CPU default: Gloo, 2 ranks, `cpu` profile (~4 min + setup)
    make fig7 ARGS="--world_size=4"             any override of Config below
    python -m experiments fig7 --bucket_caps_mb=0,5,25 --models=resnet50
    torchrun --nproc-per-node=8 --nnodes=2 ... -m experiments fig7 --world_size=16 --profile=paper

Box plots of per-iteration latency (all ranks, measured iterations after warmup) for each bucket cap, from
0 MB (one bucket per parameter, the unbucketed extreme) to a cap larger than the whole model (one bucket, so
no overlap), per model and backend. On a machine without enough GPUs the NCCL panels say so.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments import common
from harness import TrainConfig

FIGURE = "fig7"
PAPER = {
    "setup": "16 GPUs (2 servers x 8 V100), ResNet50 and BERT, NCCL and Gloo",
    "claim": "the right bucket size gives more than 2x speedup over the worst; the best size lies between the "
             "extremes, and BERT (larger model) prefers larger buckets than ResNet50",
    "best_vs_worst_speedup": 2.0,
}


@dataclass(frozen=True)
class Config:
    """Sweep of bucket caps; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")
    backends: tuple[str, ...] = ("gloo", "nccl")
    world_size: int = 2
    bucket_caps_mb: tuple[float, ...] = (0, 1, 5, 25, 100, 1000)
    impl: str = "ours"
    profile: str = "auto"
    iters: int = 10
    warmup: int = 2
    net: str = "auto"  # emulated link per rank on CPU-only machines (harness/README.md); loopback = none


def points(cfg: Config) -> list[TrainConfig]:
    backends, _ = common.split_backends(cfg.backends, cfg.world_size)
    return [TrainConfig(model=m, impl=cfg.impl, profile=cfg.profile, backend=b, world_size=cfg.world_size,
                        bucket_cap_mb=cap, iters=cfg.iters, warmup=cfg.warmup, net=cfg.net)
            for m in cfg.models for b in backends for cap in cfg.bucket_caps_mb]


def medians(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net)
    ok = ok[ok["model"].isin(cfg.models) & (ok["world_size"] == cfg.world_size)]
    return ok.groupby(["model", "backend", "bucket_cap_mb"])["total_ms"].median()


def plot(df, cfg: Config):
    return draw(df, cfg, FIGURE, PAPER)


def draw(df, cfg: Config, name: str, paper: dict):
    """Shared with Figure 8, which is this figure at a larger world size."""
    ok = common.ok_rows(df, net=cfg.net)
    ok = ok[ok["world_size"] == cfg.world_size]
    _, unavailable = common.split_backends(cfg.backends, cfg.world_size)

    def draw(ax, sel, model, backend):
        caps = sorted(sel["bucket_cap_mb"].unique())
        ax.boxplot([sel.loc[sel["bucket_cap_mb"] == cap, "total_ms"] for cap in caps],
                   tick_labels=[common.fmt_mb(cap) for cap in caps], showfliers=False)
        grad_mb = sel["num_params"].iloc[0] * 4 / 2**20
        ax.set_title(f"{model} / {backend} (gradients: {grad_mb:.3g} MB)", fontsize=10)
        ax.set_xlabel("bucket cap (MB); 0 = one bucket per parameter")
        ax.set_ylabel("per-iteration latency (ms)")
        ax.grid(axis="y", alpha=0.3)

    fig = common.model_backend_panels(ok, cfg.models, cfg.backends, unavailable, draw)
    common.title(fig, f"Figure {name[3:]}: per-iteration latency vs bucket size, {cfg.world_size} ranks",
                 f"{paper['setup']}; {paper['claim']}")
    common.caption(fig, common.describe_setup(ok))
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    return fig


def summarize(df, cfg: Config) -> str:
    lines = []
    for (model, backend), series in medians(df, cfg).groupby(level=[0, 1]):
        per_cap = series.droplevel([0, 1])
        best, worst = per_cap.idxmin(), per_cap.idxmax()
        lines.append(f"{model}/{backend}: best cap {common.fmt_mb(best)} MB ({per_cap[best]:.0f} ms), worst "
                     f"{common.fmt_mb(worst)} MB ({per_cap[worst]:.0f} ms), best vs worst "
                     f"{per_cap[worst] / per_cap[best]:.2f}x (paper: >{PAPER['best_vs_worst_speedup']:.0f}x)")
    return "\n".join(lines) or "no results"
