"""Figure 6: per-iteration latency breakdown, overlapping vs non-overlapping communication (paper Section 5.1).

    make fig6                                   CPU default: Gloo, 2 ranks, `cpu` profile (~2 min + setup)
    python -m experiments fig6 --models=resnet50 --bucket_cap_mb=10
    torchrun --nproc-per-node=8 --nnodes=4 ... -m experiments fig6 --world_size=32 --profile=paper

Stacked bars of the medians of forward, backward compute, exposed backward communication (communication
not hidden behind backward) and optimizer step, for our DDP with ``overlap=True`` (allreduce launched as
buckets fill during backward) and ``overlap=False`` (the same buckets, all reduced after backward).
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments import common
from harness import TrainConfig

FIGURE = "fig6"
PAPER = {
    "setup": "32 GPUs, ResNet50 and BERT, NCCL and Gloo",
    "claim": "overlap speeds up ResNet50 by 38.0% and BERT by 35.2% on NCCL, 26.8% and 21.5% on Gloo",
    "speedup_pct": {("resnet50", "nccl"): 38.0, ("bert-base", "nccl"): 35.2,
                    ("resnet50", "gloo"): 26.8, ("bert-base", "gloo"): 21.5},
}
PHASES = (("forward_ms", "forward"), ("backward_compute_ms", "backward compute"),
          ("backward_comm_exposed_ms", "exposed communication"), ("optimizer_ms", "optimizer step"))


@dataclass(frozen=True)
class Config:
    """Overlap on and off per model and backend; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")
    backends: tuple[str, ...] = ("gloo", "nccl")
    world_size: int = 2
    bucket_cap_mb: float = 25
    profile: str = "auto"
    iters: int = 10
    warmup: int = 2
    net: str = "auto"  # emulated link per rank on CPU-only machines (harness/README.md); loopback = none


def points(cfg: Config) -> list[TrainConfig]:
    backends, _ = common.split_backends(cfg.backends, cfg.world_size)
    return [TrainConfig(model=m, impl="ours", overlap=overlap, profile=cfg.profile, backend=b,
                        world_size=cfg.world_size, bucket_cap_mb=cfg.bucket_cap_mb, iters=cfg.iters,
                        warmup=cfg.warmup, net=cfg.net)
            for m in cfg.models for b in backends for overlap in (True, False)]


def _medians(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net)
    ok = ok[(ok["world_size"] == cfg.world_size) & (ok["bucket_cap_mb"] == cfg.bucket_cap_mb)]
    cols = [c for c, _ in PHASES] + ["total_ms"]
    return ok.groupby(["model", "backend", "overlap"])[cols].median()


def speedups(df, cfg: Config) -> dict:
    """(model, backend) -> overlap speedup in percent: non-overlapping / overlapping latency - 1."""
    med = _medians(df, cfg)["total_ms"]
    out = {}
    for (model, backend) in {(m, b) for m, b, _ in med.index}:
        if (model, backend, True) in med.index and (model, backend, False) in med.index:
            out[(model, backend)] = common.speedup_pct(med[(model, backend, False)], med[(model, backend, True)])
    return out


def plot(df, cfg: Config):
    med = _medians(df, cfg)
    gains = speedups(df, cfg)
    _, unavailable = common.split_backends(cfg.backends, cfg.world_size)
    fig, axes = common.grid([""], list(cfg.backends), width=1.6 + 2.2 * len(cfg.models), height=4.2)
    colors = ("#4C72B0", "#55A868", "#C44E52", "#8172B2")
    for c, backend in enumerate(cfg.backends):
        ax = axes[0][c]
        bars = [(m, ov) for m in cfg.models for ov in (False, True) if (m, backend, ov) in med.index]
        if backend in unavailable or not bars:
            common.mark_unavailable(ax, unavailable.get(backend, f"no results for {backend}"))
            continue
        xs = range(len(bars))
        bottom = [0.0] * len(bars)
        for (col, label), color in zip(PHASES, colors):
            heights = [float(med.loc[(m, backend, ov), col]) for m, ov in bars]
            ax.bar(xs, heights, bottom=bottom, color=color, label=label, width=0.7)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xticks(list(xs), [f"{m}\n{'overlap' if ov else 'no overlap'}" for m, ov in bars], fontsize=8)
        for model in cfg.models:
            if (model, backend) in gains:
                x = bars.index((model, True))
                paper = PAPER["speedup_pct"].get((model, backend))
                note = f"+{gains[(model, backend)]:.1f}%" + (f"\n(paper {paper}%)" if paper else "")
                ax.annotate(note, (x, bottom[x]), ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, max(bottom) * 1.25)
        ax.set_title(backend, fontsize=10)
        ax.set_ylabel("median latency per iteration (ms)")
        ax.legend(fontsize=7, loc="upper left")
    common.title(fig, f"Figure 6: latency breakdown, overlapping vs non-overlapping, {cfg.world_size} ranks, "
                      f"{cfg.bucket_cap_mb:g} MB buckets", f"{PAPER['setup']}; {PAPER['claim']}")
    common.caption(fig, common.describe_setup(common.ok_rows(df, net=cfg.net)))
    fig.tight_layout(rect=(0, 0.04, 1, 0.9))
    return fig


def summarize(df, cfg: Config) -> str:
    lines = []
    for (model, backend), gain in sorted(speedups(df, cfg).items()):
        paper = PAPER["speedup_pct"].get((model, backend))
        lines.append(f"{model}/{backend}: overlap speedup {gain:+.1f}%"
                     + (f" (paper: +{paper}%)" if paper is not None else ""))
    return "\n".join(lines) or "no results"
