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

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, paper_scale, plotting, verdicts
from harness import TrainConfig
from simulator.model.cluster_data import PAPER_OVERLAP_SPEEDUP

FIGURE = "fig6"
PAPER = {
    "setup": "32 GPUs, ResNet50 and BERT, NCCL and Gloo",
    "claim": "overlap speeds up ResNet50 by 38.0% and BERT by 35.2% on NCCL, 26.8% and 21.5% on Gloo",
    "speedup_pct": PAPER_OVERLAP_SPEEDUP,  # the simulated panel is checked against these, never fitted
}
PHASES = (
    ("forward_ms", "forward"),
    ("backward_compute_ms", "backward compute"),
    ("backward_comm_exposed_ms", "exposed communication"),
    ("optimizer_ms", "optimizer step"),
    ("other_ms", "other (outside the named phases)"),
)


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """Overlap on and off per model and backend; every field is a --key=value override."""

    world_size: int = 2  # ranks
    # DDP bucket cap (MiB), or auto: ours finds it while training, before measuring
    bucket_cap_mb: float | str = DEFAULT_BUCKET_CAP_MB
    cluster: str = paper_scale.DEFAULT_CLUSTER  # cluster simulated at the paper's scale, a panel beside ('' = none)


def points(cfg: Config) -> list[TrainConfig]:
    paper_scale.check(cfg.cluster)
    return [
        p
        for overlap in (True, False)
        for p in cfg.train_points(cfg.world_size, impl="ours", overlap=overlap, bucket_cap_mb=cfg.bucket_cap_mb)
    ]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net, hosts=cfg.hosts)
    return ok[(ok["world_size"] == cfg.world_size) & common.at_cap(ok, cfg.bucket_cap_mb)]


def _medians(df, cfg: Config):
    """Median of each phase per (model, backend, overlap); ``other_ms`` is what the median iteration holds
    beyond the medians of the named phases (bars then stack to the median latency); ``ideal_ms`` is forward
    + max(backward compute, all communication) + optimizer, the bound full overlap would reach."""
    named = [c for c, _ in PHASES[:-1]]
    med = _selected(df, cfg).groupby(["model", "backend", "overlap"])[named + ["total_ms", "ddp_backward_comm_ms"]]
    med = med.median()
    med["other_ms"] = (med["total_ms"] - med[named].sum(axis=1)).clip(lower=0)
    med["ideal_ms"] = (
        med["forward_ms"] + med[["backward_compute_ms", "ddp_backward_comm_ms"]].max(axis=1) + med["optimizer_ms"]
    )
    return med


def speedups(df, cfg: Config) -> dict:
    """(model, backend) -> overlap speedup in percent (non-overlapping / overlapping latency - 1) with its
    spread: one ratio per repetition, the two measured in the same task (``verdicts.paired_ratios``)."""
    per_task = verdicts.task_medians(_selected(df, cfg), ["model", "backend", "overlap"])
    out = {}
    for (model, backend), s in per_task.groupby(level=[0, 1]):
        s = s.droplevel([0, 1])
        if {True, False} <= set(s.index.get_level_values(0)):
            ratios = 100 * (verdicts.paired_ratios(s, False, True) - 1)
            out[(model, backend)] = verdicts.spread(ratios)
    return out


PHASE_COLORS = ("#4C72B0", "#55A868", "#C44E52", "#8172B2", "0.7")  # one per PHASES, in the simulated panel too


def plot(df, cfg: Config):
    med = _medians(df, cfg)
    gains = speedups(df, cfg)
    unavailable = common.missing_backends(_selected(df, cfg), cfg.backends, cfg.world_size)
    backends = plotting.shown_backends(cfg.backends, unavailable)
    fig, axes = plotting.grid(
        [""], backends + ["simulated"] * bool(cfg.cluster), width=1.6 + 2.2 * len(cfg.models), height=4.2
    )
    if cfg.cluster:
        paper_scale.draw_overlap(
            axes[0][-1],
            cfg.cluster,
            cfg.models,
            paper_scale.GPUS["fig6"],
            common.simulated_cap(cfg.bucket_cap_mb),
            PHASE_COLORS,
        )
    for c, backend in enumerate(backends):
        ax = axes[0][c]
        bars = [(m, ov) for m in cfg.models for ov in (False, True) if (m, backend, ov) in med.index]
        if backend in unavailable or not bars:
            plotting.mark_unavailable(ax, unavailable.get(backend, f"no results for {backend}"))
            continue
        _breakdown(ax, med, gains, backend, bars, cfg)
    return plotting.finish(
        fig,
        f"Figure 6: latency breakdown, overlapping vs non-overlapping, {common.ranks(cfg)}, "
        f"{common.fmt_mb(cfg.bucket_cap_mb)} MiB buckets",
        f"{PAPER['setup']}; {PAPER['claim']}",
        common.ok_rows(df, net=cfg.net, hosts=cfg.hosts),
        paper_scale.caption(cfg.cluster),
        unavailable=unavailable,
    )


def _breakdown(ax, med, gains: dict, backend: str, bars: list, cfg: Config) -> None:
    """One backend's panel: a stacked bar of the phases per (model, overlap) in ``bars``, the ideal of each, and
    over each model's overlapping bar its measured speedup (beside the paper's)."""
    xs = range(len(bars))
    bottom = _stacked_phases(ax, med, backend, bars)
    ideal = [float(med.loc[(m, backend, ov), "ideal_ms"]) for m, ov in bars]
    ax.hlines(
        ideal,
        [x - 0.4 for x in xs],
        [x + 0.4 for x in xs],
        colors="k",
        linestyles="--",
        label="ideal: forward + max(backward, comm) + optimizer",
    )
    ax.set_xticks(list(xs), [f"{m}\n{'overlap' if ov else 'no overlap'}" for m, ov in bars], fontsize=8)
    for model in cfg.models:
        if (model, backend) in gains:
            x = bars.index((model, True))
            paper = PAPER["speedup_pct"].get((model, backend))
            note = gains[(model, backend)].fmt("%", 1) + (f"\n(paper +{paper}%)" if paper else "")
            ax.annotate(note, (x, bottom[x]), ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, max(bottom) * 1.3)
    ax.set_title(backend, fontsize=10)
    ax.set_ylabel("median latency per iteration (ms)")
    ax.legend(fontsize=6, loc="upper left")


def _stacked_phases(ax, med, backend: str, bars: list) -> list[float]:
    """The phases' medians stacked, a bar per (model, overlap); returns the bars' tops."""
    xs = range(len(bars))
    bottom = [0.0] * len(bars)
    for (col, label), color in zip(PHASES, PHASE_COLORS):
        heights = [float(med.loc[(m, backend, ov), col]) for m, ov in bars]
        ax.bar(xs, heights, bottom=bottom, color=color, label=label, width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights)]
    return bottom


def summarize(df, cfg: Config) -> str:
    lines = []
    for (model, backend), gain in sorted(speedups(df, cfg).items()):
        paper = PAPER["speedup_pct"].get((model, backend))
        lines.append(
            f"{model}/{backend}: overlap speedup {gain.fmt('%', 1)}"
            + (f" (paper: +{paper}%)" if paper is not None else "")
        )
    return "\n".join(lines) or "no results"


def claims(df, cfg: Config) -> list[verdicts.Claim]:
    return [
        verdicts.Claim(FIGURE, f"overlap speedup, {m}/{b}", "%", PAPER["speedup_pct"].get((m, b)), gain)
        for (m, b), gain in sorted(speedups(df, cfg).items())
    ]
