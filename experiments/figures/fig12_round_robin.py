"""Figure 12: round-robin process groups, k = 1, 3, 5 underlying groups (paper Section 5.4).

    make fig12                                  CPU default: Gloo, 2 ranks (~2-3 min + setup)
    make fig12 ARGS="--groups=1,2,4 --world_size=4"
    torchrun ... -m experiments fig12 --world_size=32 --profile=paper

Box plots of per-iteration latency for our DDP whose bucket allreduces are dispatched round-robin to k
process groups (bucket i on group i mod k), so up to k buckets are reduced concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, plotting, verdicts
from harness import TrainConfig

FIGURE = "fig12"
PAPER = {
    "setup": "ResNet50 and BERT, NCCL and Gloo, 16 and 32 GPUs [likely]",
    "claim": "more process groups help, more so with more GPUs and larger models (mostly on Gloo)",
}


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """Round-robin group sweep; every field is a --key=value override."""

    world_size: int = 2  # ranks
    groups: tuple[int, ...] = (1, 3, 5)  # k: process groups used round-robin, a point each
    # DDP bucket cap (MiB), or auto: ours finds it while training, before measuring
    bucket_cap_mb: float | str = DEFAULT_BUCKET_CAP_MB


def points(cfg: Config) -> list[TrainConfig]:
    return [
        p
        for k in cfg.groups
        for p in cfg.train_points(cfg.world_size, impl="ours", bucket_cap_mb=cfg.bucket_cap_mb, round_robin_groups=k)
    ]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, net=cfg.net, hosts=cfg.hosts)
    return ok[
        ok["model"].isin(cfg.models) & (ok["world_size"] == cfg.world_size) & common.at_cap(ok, cfg.bucket_cap_mb)
    ]


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    unavailable = common.missing_backends(ok, cfg.backends, cfg.world_size)

    def draw(ax, sel, model, backend):
        boxes, lower = plotting.split_panel(ax)
        ks = sorted(sel["round_robin_groups"].unique())
        plotting.latency_boxes(boxes, sel, "round_robin_groups", lambda k: f"k = {k}", 1 if 1 in ks else None)
        boxes.set_title(f"{model} / {backend}", fontsize=10)
        if 1 in ks:  # the summary's speedup over k = 1, as it computes it
            per_task = verdicts.task_medians(sel, ["round_robin_groups"])
            plotting.paired_panel(lower, {k: verdicts.paired_ratios(per_task, 1, k) for k in ks})
            lower.set_ylabel("speedup over\nk = 1, paired")
        else:
            lower.text(
                0.5,
                0.5,
                "no k = 1 measured: no speedup to draw",
                ha="center",
                va="center",
                transform=lower.transAxes,
                fontsize=8,
            )
        lower.set_xticks(range(1, len(ks) + 1), [str(k) for k in ks])
        lower.set_xlabel("round-robin process groups (k)")

    fig = plotting.model_backend_panels(
        ok, cfg.models, cfg.backends, unavailable, draw, width=7.0, height=plotting.PAIRED_HEIGHT
    )  # wide enough for a 3-line caption
    note = (
        plotting.BOXES_NOTE
        + ", k = 1's latency / the speedups below"
        + plotting.PAIRED_NOTE
        + " of the speedup over k = 1"
    )
    return plotting.finish(
        fig,
        f"Figure 12: round-robin process groups, {common.ranks(cfg)}",
        f"{PAPER['setup']}; {PAPER['claim']}",
        ok,
        note,
        unavailable=unavailable,
    )


def _gains(df, cfg: Config) -> dict:
    """(model, backend) -> per k: latency and speedup over k = 1 (Spreads over repetitions)."""
    per_task = verdicts.task_medians(_selected(df, cfg), ["model", "backend", "round_robin_groups"])
    out = {}
    for (model, backend), s in per_task.groupby(level=[0, 1]):
        s = s.droplevel([0, 1])
        ks = sorted(set(s.index.get_level_values(0)))
        out[(model, backend)] = {
            k: (
                verdicts.spread(verdicts.per_repeat(s).xs(k)),
                verdicts.spread(verdicts.paired_ratios(s, 1, k)) if 1 in ks else None,
            )
            for k in ks
        }
    return out


def summarize(df, cfg: Config) -> str:
    lines = []
    for (model, backend), per_k in _gains(df, cfg).items():
        parts = [
            f"k={k}: {ms.fmt()}" + (f", {gain.fmt('x', 2)} vs k=1" if gain and k != 1 else "")
            for k, (ms, gain) in per_k.items()
        ]
        lines.append(f"{model}/{backend}: " + "; ".join(parts))
    return "\n".join(lines) or "no results"


def claims(df, cfg: Config) -> list[verdicts.Claim]:
    return [
        verdicts.Claim(FIGURE, f"k={k} vs k=1 round-robin groups, {m}/{b}", "x", None, gain)
        for (m, b), per_k in _gains(df, cfg).items()
        for k, (_, gain) in per_k.items()
        if gain and k == max(per_k)
    ]
