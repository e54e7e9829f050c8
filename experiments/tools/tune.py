"""Recommend a bucket cap from the calibrated simulator, then measure the recommendation.

    make tune                                            ResNet50, 2 ranks, --net=auto (~5 min on 2 cores)
    make tune ARGS="--model=bert-base --world_size=3 --net=1gbit"
    python -m experiments tune --model=resnet50 --measure=false      the prediction only (~1 min)

A fresh calibration probe (:mod:`simulator.probe.calibrate`) on the point's own ranks and link, the predicted latency
for every cap of ``grid_mb`` (the curve), and the cap :func:`simulator.model.recommend.recommend` picks: the least worst
regret over the probe's uncertain inputs (the per-call latency halved and doubled, the contentions scaled), so a
near-tie goes to the cap that stays close to the best. Then, unless ``--measure=false``, the
recommendation, torch's default (25 MiB) and the caps of ``measure_mb`` are measured in interleaved repetitions
(stored as experiment ``tune``), and the recommendation is set beside the best measured cap as a paired ratio
with its interval. Writes ``results/figures/tune.png``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, plotting, verdicts
from harness import TrainConfig, parse_dataclass, run_sweep
from harness.config import validate
from harness.launch.errors import command_line, refusing
from harness.preflight import preflight
from harness.results import load_results, results_root

EXPERIMENT = "tune"
DEFAULT_CAP_MB = float(DEFAULT_BUCKET_CAP_MB)  # torch's


@dataclass(frozen=True)
class Config:
    """Every field is a --key=value override."""

    model: str = (
        "resnet50"  # small | resnet50 | resnet101 | bert-base | bert-large | tiny-layers (harness.workloads.models)
    )
    world_size: int = 2  # ranks
    net: str = "auto"  # the link per rank: RATE (e.g. 1gbit) | auto | loopback (harness/README.md)
    grid_mb: tuple[float, ...] = (0, 0.5, 1, 2, 5, 10, 25, 50, 100, 200, 1000)  # caps (MiB) the simulator predicts
    measure: bool = True  # also measure the recommendation, 25 MiB and measure_mb; false: the prediction only
    measure_mb: tuple[float, ...] = (0, 1, 5, 25, 100, 1000)  # caps (MiB) measured beside the recommendation
    repeats: int = 3  # interleaved repetitions of each measured cap
    iters: int = 4  # measured iterations per point and repetition (and the probe's)
    warmup: int = 1  # iterations run before measuring, per point and repetition


def check(cfg: Config) -> TrainConfig:
    """Every setting checked before the probe starts (ValueError naming the first bad one): the probe's point, the
    caps of both lists, the repetitions, and what the machine must provide. Returns the probe's point."""
    probe = validate(
        TrainConfig(
            model=cfg.model, world_size=cfg.world_size, net=cfg.net, impl="ours", iters=cfg.iters, warmup=cfg.warmup
        )
    )
    if not cfg.grid_mb:
        raise ValueError("grid_mb is empty: give the caps to predict, e.g. --grid_mb=0,1,5,25,100")
    for name, caps in (("grid_mb", cfg.grid_mb), ("measure_mb", cfg.measure_mb)):
        bad = [c for c in caps if not 0 <= c < math.inf]
        if bad:
            raise ValueError(f"{name} {bad[0]} is not a bucket cap: caps are finite numbers of MiB >= 0")
    if cfg.measure and cfg.repeats < 1:
        raise ValueError(f"repeats={cfg.repeats}: measuring needs at least 1 repetition (or --measure=false)")
    preflight([probe])
    return probe


def run(cfg: Config, root=None) -> dict:
    from experiments.tools.calibrations import announced, calibration_path
    from simulator.model.recommend import recommend
    from simulator.probe.calibrate import calibrate

    with refusing():
        probe = check(cfg)
    with announced(
        f"probing {probe.model} on {probe.world_size} rank(s) ({probe.backend}, net={probe.net}) for "
        "the simulator (20-120 s)",
        prog="tune",
    ):
        cal = calibrate(probe)
    cal.save(results_root(root) / EXPERIMENT / "calibrations" / calibration_path(probe).name)
    rec = recommend(cal, cfg.grid_mb)
    out = dict(
        recommended_mb=rec.cap_mb, predicted=rec.predicted_ms, band=rec.band_ms, regret=rec.regret, measured=None
    )
    if cfg.measure:
        caps = sorted({*cfg.measure_mb, rec.cap_mb, DEFAULT_CAP_MB})
        points = [dataclasses.replace(probe, bucket_cap_mb=cap, repeat=r) for r in range(cfg.repeats) for cap in caps]
        df = run_sweep(EXPERIMENT, points, root=root)
        ok = common.ok_rows(df)
        ok = ok[
            (ok["model"] == probe.model)
            & (ok["world_size"] == probe.world_size)
            & (ok["net"] == probe.net)
            & ok["bucket_cap_mb"].isin(caps)
        ]
        out["measured"] = verdicts.task_medians(ok, ["bucket_cap_mb"])
    return out


def report(out: dict) -> str:
    rec = out["recommended_mb"]
    lines = [
        f"recommended cap: {rec:g} MiB (predicted {out['predicted'][rec]:.0f} ms, at worst "
        f"{out['regret'][rec]:.3f}x the best cap with the probe's latency and contention scaled; torch's "
        f"default 25 MiB predicted {out['predicted'].get(DEFAULT_CAP_MB, np.nan):.0f} ms)"
    ]
    per = out["measured"]
    if per is not None and len(per):
        ranking = verdicts.rank_options(per)
        ref, tied = ranking.reference, ranking.not_worse
        against = (
            f"the best measured ({ref:g} MiB)"
            if ranking.best is not None
            else f"{ref:g} MiB (no measured cap is best: {', '.join(f'{c:g}' for c in ranking.faster)} MiB faster "
            f"than it in their own paired medians, which go round; {ref:g} MiB is beaten by the least)"
        )
        for name, cap in (("recommended", rec), ("torch's default", DEFAULT_CAP_MB)):
            ratio = ranking.ratios[cap]
            lines.append(
                f"measured {name} {cap:g} MiB: {verdicts.spread(verdicts.per_repeat(per).xs(cap)).fmt()}, "
                f"{ratio.fmt('x', 3)} of {against}"
            )
        lines.append(
            f"caps not worse than {'the best' if ranking.best is not None else f'{ref:g} MiB'} beyond "
            f"{verdicts.EQUIVALENT:.0%}: {', '.join(f'{c:g}' for c in tied)} MiB; "
            f"the recommendation is {'among' if rec in tied else 'NOT among'} them"
        )
    return "\n".join(lines)


def plot(out: dict, cfg: Config, root=None):
    import matplotlib.pyplot as plt

    per = out["measured"]
    measured = per is not None and len(per)
    fig, axes = plt.subplots(
        2 if measured else 1,
        1,
        figsize=(6.5, 6.5 if measured else 4),
        sharex=True,
        squeeze=False,
        height_ratios=(3, 2) if measured else None,
    )
    ax = axes[0][0]
    ax.set(xscale="log", ylabel="ms per iteration")  # before the lower panel's ticks, which a new scale resets
    x, caps = _predicted_curve(ax, out)
    if measured:
        note = _measured_panels(ax, axes[1][0], per, out["recommended_mb"])
    else:
        note = _predicted_only_axis(ax, x, caps)
    ax.legend(fontsize=8)
    rows = load_results(EXPERIMENT, root) if measured else pd.DataFrame()  # stored rows of another run say nothing
    plotting.finish(fig, f"Bucket cap tuning: {cfg.model}, {cfg.world_size} ranks, net={cfg.net}", "", rows, note=note)
    return plotting.save(fig, EXPERIMENT, root)


def _predicted_curve(ax, out: dict) -> tuple[list[float], list[float]]:
    """The simulator's curve over the grid, its band and the recommended cap's star; returns (x drawn, caps)."""
    caps = sorted(out["predicted"])
    x = [max(c, 0.1) for c in caps]  # 0 MiB drawn at 0.1 on the log axis
    ax.plot(x, [out["predicted"][c] for c in caps], "--", color="C0", label="predicted (simulated)")
    ax.fill_between(
        x,
        [out["band"][c][0] for c in caps],
        [out["band"][c][1] for c in caps],
        color="C0",
        alpha=0.15,
        label="predicted, latency x0.5-2, contention x0.5-1.5",
    )
    rec = out["recommended_mb"]
    ax.plot([max(rec, 0.1)], [out["predicted"][rec]], "*", ms=14, color="C0", label=f"recommended: {rec:g} MiB")
    return x, caps


def _measured_panels(ax, lower, per, rec: float) -> str:
    """The measured repetitions over the curve, and below each cap's paired ratio to the reference; the note."""
    note = ". Measured: ours, in interleaved repetitions"  # predicted: the legend says by what
    for cap, values in per.groupby(level=0):
        ax.plot([max(cap, 0.1)] * len(values), values.to_numpy(), "o", color="C1", ms=4, alpha=0.7)
    med = per.groupby(level=0).median()
    ax.plot([max(c, 0.1) for c in med.index], med.to_numpy(), "-", color="C1", label="measured (repetition medians)")
    ranking = verdicts.rank_options(per)
    measured_caps = sorted(per.index.unique(level=0))
    plotting.ranking_panel(
        lower, per, ranking, measured_caps, lambda c: f"{c:g}", " MiB", [max(c, 0.1) for c in measured_caps]
    )
    lower.plot([max(rec, 0.1)], [ranking.ratios[rec].center], "*", ms=12, color="C0", zorder=3)
    _no_minor_ticks(lower)
    lower.set_xlabel("bucket cap (MiB; 0 drawn at 0.1; star = recommended)")
    return note + (
        plotting.PAIRED_NOTE + " of each measured cap's latency over the reference's" + plotting.ranking_note("cap")
    )


def _predicted_only_axis(ax, x: list[float], caps: list[float]) -> str:
    """Nothing measured: the predicted caps as the axis's ticks; the note."""
    ax.set_xticks(x, [f"{c:g}" for c in caps])  # the predicted caps, in MiB as the label says
    _no_minor_ticks(ax)
    ax.set_xlabel("bucket cap (MiB; 0 drawn at 0.1)")
    return (
        " (--measure=false, or no successful point): the calibrated simulator's prediction only "
        "(experiments/tools/predict.py)"
    )


def _no_minor_ticks(ax) -> None:
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())


def main(argv: list[str] | None = None) -> int:
    prog = "python -m experiments tune"

    def body() -> int:
        cfg = parse_dataclass(Config, argv, prog=prog)
        out = run(cfg)
        print(report(out))
        print(f"wrote {plot(out, cfg)}")
        return 0

    return command_line(prog, body)


if __name__ == "__main__":
    sys.exit(main())
