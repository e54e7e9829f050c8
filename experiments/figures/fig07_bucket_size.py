"""Figure 7: per-iteration latency vs gradient bucket size (paper Section 5.2, 16 GPUs).

    make fig7                                   CPU default: Gloo, 2 ranks, 3 repetitions (~7.5 min + setup)
    make fig7 ARGS="--world_size=4"             any override of Config below
    python -m experiments fig7 --bucket_caps_mb=0,5,25 --models=resnet50
    torchrun --nproc-per-node=8 --nnodes=2 ... -m experiments fig7 --world_size=16 --profile=paper

Box plots of per-iteration latency (all ranks, measured iterations after warmup) for each bucket cap, from
0 MB (one bucket per parameter, the unbucketed extreme) to a cap larger than the whole model (one bucket, so
no overlap), per model and backend. On a machine without enough GPUs the NCCL panels say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_impl.options import MIB
from experiments import common, paper_scale, plotting, verdicts
from harness import TrainConfig

FIGURE = "fig7"
PAPER = {
    "setup": "16 GPUs (2 servers x 8 V100), ResNet50 and BERT, NCCL and Gloo",
    "claim": "the right bucket size gives more than 2x speedup over the worst; the best size lies between the "
    "extremes, and BERT (larger model) prefers larger buckets than ResNet50",
    "best_vs_worst_speedup": 2.0,
}


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """Sweep of bucket caps; every field is a --key=value override."""

    world_size: int = 2  # ranks
    # DDP bucket caps (MiB), a point each; auto: ours finds its cap while training (a box beside the fixed caps)
    bucket_caps_mb: tuple[float | str, ...] = (0, 1, 5, 25, 100, 1000)
    impl: str = "ours"  # whose DDP: ours | torch
    # 3 repetitions x (2 + 3) iterations keep `make fig7` under 9 minutes on 2 cores (README)
    iters: int = 3  # measured iterations per point, repetition and rank
    # the first iteration rebuilds the buckets; the second, the first on them, still runs slow
    warmup: int = 2  # iterations run before measuring, per point and repetition, never stored
    cluster: str = paper_scale.DEFAULT_CLUSTER  # cluster simulated at the paper's scale, a panel beside ('' = none)


def points(cfg: Config) -> list[TrainConfig]:
    paper_scale.check(cfg.cluster)
    return [p for cap in cfg.bucket_caps_mb for p in cfg.train_points(cfg.world_size, impl=cfg.impl, bucket_cap_mb=cap)]


def task_medians(df, cfg: Config):
    """Per (model, backend, bucket cap, repetition, task): the median latency (``verdicts.task_medians``)."""
    ok = common.ok_rows(df, net=cfg.net, hosts=cfg.hosts)
    ok = ok[ok["model"].isin(cfg.models) & (ok["world_size"] == cfg.world_size) & ~common.is_auto(ok)]
    return verdicts.task_medians(ok, ["model", "backend", "bucket_cap_mb"])


def plot(df, cfg: Config):
    return draw(df, cfg, FIGURE, PAPER)


def draw(df, cfg: Config, name: str, paper: dict):
    """Shared with Figure 8, which is this figure at a larger world size."""
    ok = common.caps_as_keys(common.ok_rows(df, net=cfg.net, hosts=cfg.hosts))
    ok = ok[ok["world_size"] == cfg.world_size]
    unavailable = common.missing_backends(ok, cfg.backends, cfg.world_size)

    def draw(ax, sel, model, backend):
        per_task = verdicts.task_medians(sel, ["bucket_cap_mb"])
        ranking = verdicts.rank_options(per_task)
        boxes, lower = plotting.split_panel(ax)
        plotting.latency_boxes(boxes, sel, "bucket_cap_mb", _cap_label, ranking.reference)
        grad_mib = sel["num_params"].iloc[0] * 4 / MIB
        boxes.set_title(f"{model} / {backend} (gradients: {grad_mib:.3g} MiB)", fontsize=10)
        caps = sorted(sel["bucket_cap_mb"].unique())
        plotting.ranking_panel(lower, per_task, ranking, caps, common.fmt_mb, " MiB")
        lower.set_xlabel("bucket cap (MiB); 0 = one bucket per parameter")

    gpus = paper_scale.GPUS[name]
    simulated = cfg.cluster and (
        lambda ax, model: paper_scale.draw_caps(
            ax, cfg.cluster, model, gpus, [c for c in cfg.bucket_caps_mb if c != common.AUTO]
        )
    )
    fig = plotting.model_backend_panels(
        ok, cfg.models, cfg.backends, unavailable, draw, simulated=simulated, width=5.0, height=plotting.PAIRED_HEIGHT
    )  # room for a 3-line caption
    note = (
        plotting.BOXES_NOTE
        + ", the reference's latency x the ratios below"
        + plotting.PAIRED_NOTE
        + " of each cap's latency / the reference's"
        + plotting.ranking_note("cap")
        + paper_scale.caption(cfg.cluster)
    )
    return plotting.finish(
        fig,
        f"Figure {name[3:]}: per-iteration latency vs bucket size, {common.ranks(cfg)}",
        f"{paper['setup']}; {paper['claim']}",
        ok,
        note,
        unavailable=unavailable,
    )


def bucket_verdicts(df, cfg: Config) -> dict:
    """(model, backend) -> the caps ranked against the best (``verdicts.rank_options``; its reference where no cap
    is best), the worst cap, the reference's latency and worst over reference (Spreads over repetitions, each ratio
    paired by ``verdicts.paired_ratios``), as the figure draws them."""
    out = {}
    for (model, backend), series in task_medians(df, cfg).groupby(level=[0, 1]):
        per_cap = series.droplevel([0, 1])
        ranking = verdicts.rank_options(per_cap)
        out[(model, backend)] = dict(
            ranking=ranking,
            worst=ranking.worst,
            best_ms=verdicts.spread(verdicts.per_repeat(per_cap).xs(ranking.reference)),
            gain=ranking.ratios[ranking.worst],
        )
    return out


def summarize(df, cfg: Config) -> str:
    claim = PAPER["best_vs_worst_speedup"]

    def caps(values):
        return ", ".join(common.fmt_mb(c) for c in values) + " MiB" if values else "none"

    lines = []
    for (model, backend), v in bucket_verdicts(df, cfg).items():
        r, ref = v["ranking"], common.fmt_mb(v["ranking"].reference)
        best = (
            f"best cap {ref} MiB"
            if r.best is not None
            else f"best cap not resolved ({caps(r.faster)} faster than {ref} MiB in their own paired medians, which go "
            f"round; {ref} MiB, beaten by the least, is the reference)"
        )
        lines.append(
            f"{model}/{backend}: {best}, {v['best_ms'].fmt()}; tied with it (within "
            f"{verdicts.EQUIVALENT:.0%}): {caps(r.tied)}; not resolved: {caps(r.unresolved)}; worse: "
            f"{caps(r.worse)}; worst {common.fmt_mb(v['worst'])} MiB; "
            f"{'best' if r.best is not None else ref + ' MiB'} vs worst "
            f"{v['gain'].fmt('x', 2)} (paper: >{claim:.0f}x, {verdicts.verdict(v['gain'], claim)})"
        )
    return "\n".join(lines) or "no results"


def claims(df, cfg: Config, name: str = FIGURE) -> list[verdicts.Claim]:
    return [
        verdicts.Claim(
            name,
            f"{'best' if v['ranking'].best is not None else 'reference'} vs worst bucket cap, {m}/{b}",
            "x",
            PAPER["best_vs_worst_speedup"],
            v["gain"],
        )
        for (m, b), v in bucket_verdicts(df, cfg).items()
    ]


def _cap_label(cap: float) -> str:
    return common.fmt_mb(cap) + ("" if cap == common.AUTO_KEY else " MiB")
