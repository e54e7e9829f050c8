"""Figure 10: skipping gradient synchronization with no_sync, every n = 1, 2, 4, 8 iterations (paper Section 5.3).

    make fig10                                  CPU default: Gloo, 2 and 4 ranks (~7 min + setup)
    make fig10 ARGS="--sync_every=1,4 --world_sizes=2"
    torchrun ... -m experiments fig10 --world_sizes=32 --profile=paper

Per n: the average per-iteration latency (mean over all measured iterations, synchronized or not, so
communication is amortized over n iterations; median over repetitions with its 95% interval), and apart from
it the two populations it averages: synchronized iterations (communication) and skipped ones (``no_sync``,
none). One marker group per world size, no lines drawn between measured points. ``iters`` must be a
multiple of every n (refused otherwise). ``warmup`` counts cycles of n iterations: with the default 2, neither
the first synchronized iteration (the first bucket layout) nor the next one (whose forward rebuilds the buckets)
is measured, at any n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, plotting, verdicts
from harness import TrainConfig

FIGURE = "fig10"
PAPER = {
    "setup": "ResNet50 and BERT, NCCL and Gloo, up to 256 GPUs",
    "claim": "synchronizing every n iterations significantly reduces the average (amortized) latency",
}


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """no_sync sweep; every field is a --key=value override."""

    world_sizes: tuple[int, ...] = (2, 4)  # ranks, a point each
    sync_every: tuple[int, ...] = (1, 2, 4, 8)  # n: synchronize 1 of every n iterations (no_sync on the others)
    # DDP bucket cap (MiB), or auto: ours finds it while training, before measuring
    bucket_cap_mb: float | str = DEFAULT_BUCKET_CAP_MB
    impl: str = "ours"  # whose DDP: ours | torch
    iters: int = 8  # measured iterations per point, repetition and rank: a multiple of every n


def points(cfg: Config) -> list[TrainConfig]:
    uneven = [n for n in cfg.sync_every if n > 0 and cfg.iters % n]
    if uneven:  # else the last cycle is cut short: fewer synchronized iterations than 1 in n, amortized too low
        every = math.lcm(*(n for n in cfg.sync_every if n > 0))
        raise ValueError(
            f"iters={cfg.iters} must be a multiple of every n of sync_every, but not of "
            f"{', '.join(map(str, uneven))}: e.g. iters={every * max(1, math.ceil(cfg.iters / every))}"
        )
    return [
        p
        for ws in cfg.world_sizes
        for n in cfg.sync_every
        for p in cfg.train_points(
            ws, impl=cfg.impl, bucket_cap_mb=cfg.bucket_cap_mb, sync_every=n, warmup=cfg.warmup * n
        )
    ]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, synced_only=False, net=cfg.net, hosts=cfg.hosts)  # amortized: no_sync iterations count too
    return ok[
        ok["model"].isin(cfg.models)
        & ok["sync_every"].isin(cfg.sync_every)
        & common.at_cap(ok, cfg.bucket_cap_mb)
        & (ok["warmup"] == cfg.warmup * ok["sync_every"])
    ]  # not points stored before warmup counted cycles


def _repeat_values(sel):
    """Per (world size, n, repetition): the amortized mean, and the medians of synced and skipped iterations."""
    keys = ["world_size", "sync_every"]
    return {
        "amortized (mean of all)": verdicts.repeat_medians(sel, keys, agg="mean"),
        "synchronized iterations": verdicts.repeat_medians(sel[sel["synced"].astype(bool)], keys),
        "skipped (no_sync) iterations": verdicts.repeat_medians(sel[~sel["synced"].astype(bool)], keys),
    }


STYLES = {
    "amortized (mean of all)": dict(marker="o", ms=6),
    "synchronized iterations": dict(marker="^", ms=5, mfc="none"),
    "skipped (no_sync) iterations": dict(marker="v", ms=5, mfc="none"),
}  # the markers of _repeat_values' populations, in its order


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    unavailable = common.missing_backends(ok, cfg.backends, max(cfg.world_sizes))
    fig = plotting.model_backend_panels(
        ok, cfg.models, cfg.backends, unavailable, _panel, width=6.5, height=plotting.PAIRED_HEIGHT
    )
    note = (
        ". Above: median over repetitions and its 95% interval"
        + plotting.PAIRED_NOTE
        + " of the amortized saving vs n = 1"
    )
    return plotting.finish(
        fig,
        "Figure 10: skipping gradient synchronization",
        f"{PAPER['setup']}; {PAPER['claim']}",
        ok,
        note,
        unavailable=unavailable,
    )


def _panel(ax, sel, model: str, backend: str) -> None:
    """One (model, backend): the latencies per n above, a marker group per world size; below, the saving vs n = 1."""
    sizes = sorted(int(n) for n in sel["world_size"].unique())
    ns = sorted(int(n) for n in sel["sync_every"].unique())
    width = 0.8 / max(1, len(sizes))
    upper, lower = plotting.split_panel(ax)
    upper.set_title(f"{model} / {backend}", fontsize=10)
    _latencies(upper, sel, sizes, ns, width)
    _savings_panel(lower, sel, sizes, ns, width)


def _latencies(ax, sel, sizes: list[int], ns: list[int], width: float) -> None:
    """Per population (_repeat_values) and world size, at each n: the median over repetitions and its interval."""
    for (label, per_repeat), (_, style) in zip(_repeat_values(sel).items(), STYLES.items()):
        for j, ws in enumerate(sizes):
            xs, centers, errs = [], [], [[], []]
            for i, n in enumerate(ns):
                if (ws, n) in per_repeat.droplevel(-1).index:
                    sp = verdicts.spread(per_repeat.xs((ws, n)))
                    xs.append(i - 0.4 + width * (j + 0.5))
                    centers.append(sp.center)
                    errs[0].append(sp.center - sp.lo)
                    errs[1].append(sp.hi - sp.center)
            ax.errorbar(
                xs, centers, yerr=errs, ls="none", color=f"C{j}", capsize=2, **style, label=f"{ws} ranks, {label}"
            )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("latency per iteration (ms)")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(axis="y", alpha=0.3)


def _savings_panel(ax, sel, sizes: list[int], ns: list[int], width: float) -> None:
    """Per world size, at each n above 1: the amortized saving vs n = 1, paired (:func:`_saving_per_repeat`)."""
    for j, ws in enumerate(sizes):  # the summary's saving vs n = 1, as it computes it
        per_task = verdicts.task_medians(sel[sel["world_size"] == ws], ["sync_every"], agg="mean")
        per_n = _saving_per_repeat(per_task)
        if per_n:
            plotting.paired_panel(
                ax,
                per_n,
                [ns.index(n) - 0.4 + width * (j + 0.5) for n in per_n],
                0.0,
                color=f"C{j}",
                label=f"{ws} ranks",
                dots_label=None,
            )
    ax.set_xticks(range(len(ns)), [str(n) for n in ns])
    ax.set_xlabel("synchronize every n iterations")
    ax.set_ylabel("amortized saving\nvs n = 1 (%), paired")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))


def _saving_per_repeat(per_task) -> dict:
    """n -> the amortized saving vs n = 1 in percent, one per repetition (paired in its task), from the amortized
    means per (n, repetition, task) of one world size; empty without n = 1."""
    ns = sorted(set(per_task.index.get_level_values(0)))
    return {n: 100 * (1 - verdicts.paired_ratios(per_task, n, 1)) for n in ns if n != 1} if 1 in ns else {}


def _savings(df, cfg: Config) -> dict:
    """(model, backend, world size) -> (amortized latency per n, saving of the largest n vs n = 1 in percent),
    Spreads over repetitions (the two of a saving measured in the same task)."""
    per_task = verdicts.task_medians(_selected(df, cfg), ["model", "backend", "world_size", "sync_every"], agg="mean")
    out = {}
    for key, s in per_task.groupby(level=[0, 1, 2]):
        s = s.droplevel([0, 1, 2])
        ns = sorted(set(s.index.get_level_values(0)))
        per_n = _saving_per_repeat(s)
        saving = (ns[-1], verdicts.spread(per_n[ns[-1]])) if per_n else None
        out[key] = ({n: verdicts.spread(verdicts.per_repeat(s).xs(n)) for n in ns}, saving)
    return out


def summarize(df, cfg: Config) -> str:
    lines = []
    for (model, backend, ws), (per_n, saving) in _savings(df, cfg).items():
        parts = ", ".join(f"n={n}: {sp.fmt()}" for n, sp in per_n.items())
        if saving:
            parts += f"; n={saving[0]} saves {saving[1].fmt('%')} vs n=1"
        lines.append(f"{model}/{backend}, {ws} ranks: {parts}")
    return "\n".join(lines) or "no results"


def claims(df, cfg: Config) -> list[verdicts.Claim]:
    return [
        verdicts.Claim(FIGURE, f"n={saving[0]} vs n=1 amortized saving, {m}/{b}, {ws} ranks", "%", None, saving[1])
        for (m, b, ws), (_, saving) in _savings(df, cfg).items()
        if saving
    ]
