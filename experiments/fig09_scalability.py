"""Figure 9: per-iteration latency vs number of ranks, weak scaling (paper Section 5.3, up to 256 GPUs).

    make fig9                                   CPU default: Gloo, 1, 2 and 4 ranks (~3 min + setup)
    make fig9 ARGS="--world_sizes=1,2,3 --models=resnet50"
    torchrun ... -m experiments fig9 --world_sizes=32 --profile=paper   (one job per world size; each job
                                                stores the points of its own WORLD_SIZE)

The per-rank batch and threads are fixed, so ideal scaling is a flat line. On one CPU machine more ranks also share the
same cores, so latency grows with compute contention as well as communication; the caption says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments import common
from harness import TrainConfig

FIGURE = "fig9"
PAPER = {
    "setup": "ResNet50 and BERT, NCCL and Gloo, up to 256 GPUs, fixed per-GPU batch",
    "claim": "near-linear scalability: per-iteration latency grows slowly with the number of GPUs",
}


@dataclass(frozen=True)
class Config:
    """Weak-scaling sweep over world sizes; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")
    backends: tuple[str, ...] = ("gloo", "nccl")
    world_sizes: tuple[int, ...] = (1, 2, 4)
    bucket_cap_mb: float = 25
    impl: str = "ours"
    profile: str = "auto"
    iters: int = 10
    warmup: int = 2
    threads_per_rank: int = 1  # fixed, so every world size does the same compute per rank (0 = cores // ranks)
    net: str = "auto"  # emulated link per rank on CPU-only machines (harness/README.md); loopback = none


def points(cfg: Config) -> list[TrainConfig]:
    out = []
    for n in cfg.world_sizes:
        backends, _ = common.split_backends(cfg.backends, n)
        out += [TrainConfig(model=m, impl=cfg.impl, profile=cfg.profile, backend=b, world_size=n,
                            bucket_cap_mb=cfg.bucket_cap_mb, iters=cfg.iters, warmup=cfg.warmup, net=cfg.net,
                            threads_per_rank=cfg.threads_per_rank)
                for m in cfg.models for b in backends]
    return out


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net)
    return ok[ok["model"].isin(cfg.models) & (ok["bucket_cap_mb"] == cfg.bucket_cap_mb)]


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    _, unavailable = common.split_backends(cfg.backends, max(cfg.world_sizes))

    def draw(ax, sel, model, backend):
        common.median_lines(ax, sel, "world_size", "total_ms", "impl", label=lambda k: f"DDP ({k})")
        ax.set_ylim(bottom=0)
        ax.set_xticks(sorted(int(n) for n in sel["world_size"].unique()))
        ax.set_xlabel("ranks (fixed batch and threads per rank)")
        ax.set_ylabel("per-iteration latency (ms)")
        ax.legend(fontsize=8)

    fig = common.model_backend_panels(ok, cfg.models, cfg.backends, unavailable, draw)
    common.title(fig, "Figure 9: latency vs number of ranks (weak scaling)", f"{PAPER['setup']}; {PAPER['claim']}")
    common.caption(fig, common.describe_setup(ok) + ". On one machine, ranks also share its CPU cores.")
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    return fig


def summarize(df, cfg: Config) -> str:
    med = _selected(df, cfg).groupby(["model", "backend", "world_size"])["total_ms"].median()
    lines = []
    for (model, backend), s in med.groupby(level=[0, 1]):
        s = s.droplevel([0, 1])
        lo, hi = s.index.min(), s.index.max()
        lines.append(f"{model}/{backend}: {s[lo]:.0f} ms at {lo} rank(s) -> {s[hi]:.0f} ms at {hi} "
                     f"({s[hi] / s[lo]:.2f}x latency for {hi / lo:g}x ranks; weak-scaling efficiency "
                     f"{100 * s[lo] / s[hi]:.0f}%)")
    return "\n".join(lines) or "no results"
