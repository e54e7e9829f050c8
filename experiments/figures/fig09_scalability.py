"""Figure 9: per-iteration latency vs number of ranks, weak scaling (paper Section 5.3, up to 256 GPUs).

    make fig9                                   CPU default: Gloo, 1, 2 and 4 ranks (~3 min + setup)
    make fig9 ARGS="--world_sizes=1,2,3 --models=resnet50"
    torchrun ... -m experiments fig9 --world_sizes=32 --profile=paper   (one job per world size; each job
                                                stores the points of its own WORLD_SIZE)

The per-rank batch and threads are fixed, so ideal scaling is a flat line (drawn at the 1-rank latency). On one
CPU machine more ranks also share the same cores, so latency grows with compute contention as well as with
communication: the same model without DDP (``impl=local``, no communication) is measured at every world size,
and the gap between it and DDP is what communication costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, paper_scale, plotting, verdicts
from harness import TrainConfig

FIGURE = "fig9"
PAPER = {
    "setup": "ResNet50 and BERT, NCCL and Gloo, up to 256 GPUs, fixed per-GPU batch",
    "claim": "near-linear scalability: per-iteration latency grows slowly with the number of GPUs",
}


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """Weak-scaling sweep over world sizes; every field is a --key=value override."""

    world_sizes: tuple[int, ...] = (1, 2, 4)  # ranks, a point each (weak scaling: the batch per rank is fixed)
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB  # DDP bucket cap (MiB)
    impl: str = "ours"  # whose DDP: ours | torch
    # fixed, so that every world size does the same compute per rank
    threads_per_rank: int = 1  # torch's threads per rank; 0 = cores // ranks
    cluster: str = paper_scale.DEFAULT_CLUSTER  # cluster simulated at the paper's scale, a panel beside ('' = none)


def points(cfg: Config) -> list[TrainConfig]:
    paper_scale.check(cfg.cluster)
    return [
        p
        for n in cfg.world_sizes
        for impl in dict.fromkeys((cfg.impl, "local"))
        for p in cfg.train_points(n, impl=impl, bucket_cap_mb=cfg.bucket_cap_mb, threads_per_rank=cfg.threads_per_rank)
    ]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net, hosts=cfg.hosts)
    return ok[ok["model"].isin(cfg.models) & (ok["bucket_cap_mb"] == cfg.bucket_cap_mb)]


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    unavailable = common.missing_backends(ok, cfg.backends, max(cfg.world_sizes))

    def draw(ax, sel, model, backend):
        plotting.median_lines(
            ax,
            sel,
            "world_size",
            "total_ms",
            "impl",
            label=lambda k: "no DDP (local): compute only" if k == "local" else f"DDP ({k})",
        )
        plotting.repeat_markers(ax, sel, ["impl", "world_size"], "world_size")
        ddp = sel[sel["impl"] != "local"]
        one = ddp.loc[ddp["world_size"] == ddp["world_size"].min(), "total_ms"]
        if len(one):
            ax.axhline(one.median(), ls="--", color="k", lw=1, label="ideal: flat at the fewest ranks")
        ax.set_ylim(bottom=0)
        ax.set_xticks(sorted(int(n) for n in sel["world_size"].unique()))
        ax.set_xlabel("ranks (fixed batch and threads per rank)")
        ax.set_ylabel("per-iteration latency (ms)")
        ax.legend(fontsize=8)

    simulated = cfg.cluster and (lambda ax, model: paper_scale.draw_scaling(ax, cfg.cluster, model, cfg.bucket_cap_mb))
    fig = plotting.model_backend_panels(ok, cfg.models, cfg.backends, unavailable, draw, simulated=simulated)
    note = ". On one machine, ranks also share its CPU cores" + paper_scale.caption(cfg.cluster)
    sizes = sorted(int(n) for n in ok.loc[ok["impl"] != "local", "world_size"].unique()) if len(ok) else []
    ranks = f", {', '.join(map(str, sizes))} ranks" if sizes else ""  # what sets the variants' figures apart
    hosts = f" on {cfg.hosts} emulated hosts" if cfg.hosts > 1 else ""
    return plotting.finish(
        fig,
        f"Figure 9: latency vs number of ranks (weak scaling){ranks}{hosts}",
        f"{PAPER['setup']}; {PAPER['claim']}",
        ok,
        note,
        unavailable=unavailable,
    )


def _scaling(df, cfg: Config) -> dict:
    """(model, backend) -> {ranks: (DDP latency, weak-scaling efficiency vs the fewest ranks in %, no-DDP latency,
    DDP / no DDP)}, Spreads over repetitions (the last two None without no-DDP rows). Ratios are taken repetition
    by repetition (paired in one task at one rank; at more, no DDP needs no emulated link and runs apart)."""
    per_task = verdicts.task_medians(_selected(df, cfg), ["model", "backend", "impl", "world_size"])
    out = {}
    for (model, backend), s in per_task.groupby(level=[0, 1]):
        s = s.droplevel([0, 1])
        impls = set(s.index.get_level_values(0))
        if cfg.impl not in impls:
            continue
        ddp = s.xs(cfg.impl)
        ddp_per_repeat = verdicts.per_repeat(ddp)
        sizes = sorted(set(ddp.index.get_level_values(0)))
        local = verdicts.per_repeat(s.xs("local")) if "local" in impls else None
        rows = {}
        for n in sizes:
            latency = verdicts.spread(ddp_per_repeat.xs(n))
            efficiency = verdicts.spread(100 * verdicts.paired_ratios(ddp, sizes[0], n))
            alone = over = None
            if local is not None and n in local.index.get_level_values(0):
                alone = verdicts.spread(local.xs(n))
                over = verdicts.spread(verdicts.paired_ratios(s.xs(n, level=1), cfg.impl, "local"))
            rows[n] = (latency, efficiency, alone, over)
        out[model, backend] = rows
    return out


def summarize(df, cfg: Config) -> str:
    """Per model, backend and world size: DDP latency, weak-scaling efficiency, and no DDP (compute alone, slowed
    by sharing the machine as much) with DDP's ratio to it, each with its spread over repetitions."""
    lines = []
    for (model, backend), per_n in _scaling(df, cfg).items():
        parts = []
        for i, (n, (latency, efficiency, local, over)) in enumerate(per_n.items()):
            text = f"{n} rank(s) {latency.fmt()}"
            if i:
                text += f", efficiency {efficiency.fmt('%')}"
            if over is not None:
                text += f"; no DDP {local.fmt()}, DDP / no DDP {over.fmt('x', 2)}"
            parts.append(text)
        lines.append(f"{model}/{backend}: " + "; ".join(parts))
    return "\n".join(lines) or "no results"


def claims(df, cfg: Config) -> list[verdicts.Claim]:
    return [
        verdicts.Claim(FIGURE, f"weak-scaling efficiency {min(per_n)} -> {n} ranks, {m}/{b}", "%", None, eff)
        for (m, b), per_n in _scaling(df, cfg).items()
        for n, (_, eff, _, _) in per_n.items()
        if n != min(per_n)
    ]
