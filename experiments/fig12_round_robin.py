"""Figure 12: round-robin process groups, k = 1, 3, 5 underlying groups (paper Section 5.5).

    make fig12                                  CPU default: Gloo, 2 ranks (~2-3 min + setup)
    make fig12 ARGS="--groups=1,2,4 --world_size=4"
    torchrun ... -m experiments fig12 --world_size=32 --profile=paper

Box plots of per-iteration latency for our DDP whose bucket allreduces are dispatched round-robin to k
process groups (bucket i on group i mod k), so up to k buckets are reduced concurrently.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments import common
from harness import TrainConfig

FIGURE = "fig12"
PAPER = {
    "setup": "ResNet50 and BERT, NCCL and Gloo, 16 and 32 GPUs [likely]",
    "claim": "more process groups help, more so with more GPUs and larger models (mostly on Gloo)",
}


@dataclass(frozen=True)
class Config:
    """Round-robin group sweep; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")
    backends: tuple[str, ...] = ("gloo", "nccl")
    world_size: int = 2
    groups: tuple[int, ...] = (1, 3, 5)
    bucket_cap_mb: float = 25
    profile: str = "auto"
    iters: int = 10
    warmup: int = 2
    net: str = "auto"  # emulated link per rank on CPU-only machines (harness/README.md); loopback = none


def points(cfg: Config) -> list[TrainConfig]:
    backends, _ = common.split_backends(cfg.backends, cfg.world_size)
    return [TrainConfig(model=m, impl="ours", profile=cfg.profile, backend=b, world_size=cfg.world_size,
                        bucket_cap_mb=cfg.bucket_cap_mb, round_robin_groups=k, iters=cfg.iters,
                        warmup=cfg.warmup, net=cfg.net)
            for m in cfg.models for b in backends for k in cfg.groups]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net)
    return ok[ok["model"].isin(cfg.models) & (ok["world_size"] == cfg.world_size)
              & (ok["bucket_cap_mb"] == cfg.bucket_cap_mb)]


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    _, unavailable = common.split_backends(cfg.backends, cfg.world_size)

    def draw(ax, sel, model, backend):
        ks = sorted(sel["round_robin_groups"].unique())
        ax.boxplot([sel.loc[sel["round_robin_groups"] == k, "total_ms"] for k in ks],
                   tick_labels=[str(k) for k in ks], showfliers=False)
        ax.set_xlabel("round-robin process groups (k)")
        ax.set_ylabel("per-iteration latency (ms)")
        ax.grid(axis="y", alpha=0.3)

    fig = common.model_backend_panels(ok, cfg.models, cfg.backends, unavailable, draw)
    common.title(fig, f"Figure 12: round-robin process groups, {cfg.world_size} ranks",
                 f"{PAPER['setup']}; {PAPER['claim']}")
    common.caption(fig, common.describe_setup(ok))
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    return fig


def summarize(df, cfg: Config) -> str:
    med = _selected(df, cfg).groupby(["model", "backend", "round_robin_groups"])["total_ms"].median()
    lines = []
    for (model, backend), s in med.groupby(level=[0, 1]):
        s = s.droplevel([0, 1])
        parts = ", ".join(f"k={k}: {v:.0f} ms" for k, v in s.items())
        if 1 in s.index:
            parts += f" (best k={s.idxmin()}, {s[1] / s.min():.2f}x vs k=1)"
        lines.append(f"{model}/{backend}: {parts}")
    return "\n".join(lines) or "no results"
