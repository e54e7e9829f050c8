"""Figure 8: per-iteration latency vs bucket size at a larger world size (paper Section 5.2, 32 GPUs).

    make fig8                                   CPU default: Gloo, 4 ranks on this machine (~8 min + setup)
    make fig8 WORLD_SIZE=3 ARGS="--models=resnet50"
    torchrun --nproc-per-node=8 --nnodes=4 ... -m experiments fig8 --world_size=32 --profile=paper

Figure 7's sweep and plot at a world size larger than Figure 7's default; see fig07_bucket_size.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.figures import fig07_bucket_size as fig7

FIGURE = "fig8"
PAPER = {
    "setup": "32 GPUs (4 servers x 8 V100), ResNet50 and BERT, NCCL and Gloo",
    "claim": "as Figure 7 with more GPUs: the bucket size matters more, best sizes lie between the extremes",
    "best_vs_worst_speedup": 2.0,
}


@dataclass(frozen=True)
class Config(fig7.Config):
    """Figure 7's settings at a larger default world size, with the caps that decide BERT's best (50, 100 MiB)."""

    world_size: int = 4
    bucket_caps_mb: tuple[float | str, ...] = (0, 1, 5, 25, 50, 100, 1000)


points = fig7.points


def plot(df, cfg: Config):
    return fig7.draw(df, cfg, FIGURE, PAPER)


summarize = fig7.summarize


def claims(df, cfg: Config):
    return fig7.claims(df, cfg, FIGURE)
