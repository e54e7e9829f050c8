"""Validate what the simulator says DDP adds where the host sets the pace (many tiny parameters).

    make hostval                               tiny-layers, 1 and 2 ranks, caps 0.005 / 0.05 / 1 MiB, 8 repeats each
                                               (~7 min)
    python -m experiments hostval --world_sizes=2 --repeats=1 --rounds=20

Each repeat: a full calibration probe (:mod:`simulator.probe.calibrate`), then one job on the same ranks in which every
round runs, in an order shuffled per round (the same on every rank), one iteration without DDP (each gradient's
ready time stamped, as the probe does) and one of DDP at each cap. A cap's prediction takes its compute from those
interleaved iterations (the slowest rank in each) and all that DDP adds from the probe: its host work per gradient
and per bucket (measured on a stand-in model, not this one), the link, the per-call latency and the contentions.
The host's speed, which moved 30% within minutes on 2 shared cores, then cancels, and what is compared is the model
of DDP's overhead, as on the H100 (``simulator.model.clusters.host_check``). The end-to-end prediction (compute from the
probe too) is kept beside it. At one rank DDP adds its host work alone (what the H100 check measured); at two, on cores
the ranks share, the link and Gloo's calls as well. The goal is 5% for each cap's median error over the
repeats (:func:`summary`). Writes ``results/hostval/hostval.csv`` after every repeat; each run starts afresh.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import random
import statistics
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch.distributed as dist

from experiments.stats import bootstrap_median_ci
from harness import TrainConfig, parse_dataclass, run_point
from harness.config import validate
from harness.launch.errors import command_line, refusing
from harness.preflight import preflight
from harness.results import results_root, write_csv_atomic
from harness.workloads.models import seeded_model
from harness.workloads.runner import build_trainer, timed_iteration

EXPERIMENT = "hostval"
GOAL_PCT = 5.0
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class Config:
    """Every field is a --key=value override."""

    # tiny-layers: 800 gradients of 16 or 256 elements, so DDP's host work is most of what it adds
    model: str = (
        "tiny-layers"  # small | resnet50 | resnet101 | bert-base | bert-large | tiny-layers (harness.workloads.models)
    )
    world_sizes: tuple[int, ...] = (1, 2)  # ranks: 1, DDP's host work alone; 2, with the link, on shared cores
    net: str = "loopback"  # the link per rank: loopback | RATE (e.g. 1gbit) | auto (harness/README.md)
    # one intra-op thread a rank, as fig7's 2 ranks on 2 cores have: a rank alone would get 2, and OpenMP's spinning
    # worker then delays Gloo's thread (one rank, one bucket: its call took 2.8 ms, 0.75 with OMP_WAIT_POLICY=PASSIVE)
    threads_per_rank: int = 1  # torch's threads per rank; 0 = cores // ranks
    caps_mb: tuple[float, ...] = (0.005, 0.05, 1.0)  # DDP bucket caps (MiB); tiny-layers: 80, 9 and 1 buckets
    rounds: int = 60  # measured rounds of the interleaved job (one iteration of each variant each)
    warmup: int = 3  # rounds (and probe iterations) before measuring; >= 2, as DDP rebuilds its buckets
    # probe + job, each repeat's prediction against its own measurement: single repeats spread -29% to +26% (the
    # probe's per-call latency and per-gradient cost move between probes), runs of 5 repeats -9% to +10%
    repeats: int = 8  # probe and interleaved job, each repeat's prediction against its own measurement
    probe_iters: int = 30  # the probe's measured iterations


def check(cfg: Config) -> list[TrainConfig]:
    """Every setting checked before anything runs (ValueError naming the first bad one); the probes' points, one
    per world size."""
    if not cfg.caps_mb or any(not 0 <= c < float("inf") for c in cfg.caps_mb):
        raise ValueError(f"caps_mb={list(cfg.caps_mb)}: give bucket caps in MiB, finite and >= 0")
    for name in ("rounds", "repeats", "probe_iters"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name}={getattr(cfg, name)}: needs at least 1")
    if cfg.warmup < 2:
        raise ValueError(f"warmup={cfg.warmup}: DDP rebuilds its buckets in its second iteration; at least 2")
    if not cfg.world_sizes or len(set(cfg.world_sizes)) < len(cfg.world_sizes):
        raise ValueError(f"world_sizes={list(cfg.world_sizes)}: give one or more distinct world sizes")
    probes = [
        validate(
            TrainConfig(
                model=cfg.model,
                world_size=ws,
                net=cfg.net,
                impl="ours",
                iters=cfg.probe_iters,
                warmup=cfg.warmup,
                threads_per_rank=cfg.threads_per_rank,
            )
        )
        for ws in cfg.world_sizes
    ]
    preflight(probes)
    return probes


def interleaved_rank(ctx, cfg: TrainConfig, caps_mb: list, rounds: int, warmup: int) -> list[dict]:
    """One rank's job (a ``run_point`` fn): per round, one iteration without DDP and one of DDP at each cap, in an
    order shuffled per round by a seed every rank shares. Returns the no-DDP iterations as the probe does (for
    :func:`simulator.probe.calibrate.slowest_compute`) and DDP's phases per cap."""
    from simulator.probe.rank import RankProbe

    probe = RankProbe(ctx, cfg)
    trainers = {
        cap: build_trainer(
            seeded_model(cfg.model, cfg.seed).to(ctx.device), dataclasses.replace(cfg, bucket_cap_mb=cap), ctx
        )
        for cap in caps_mb
    }
    order, rng = [None, *caps_mb], random.Random(cfg.seed)
    runs, ddp = [], {cap: [] for cap in caps_mb}
    for rnd in range(warmup + rounds):
        rng.shuffle(order)
        for cap in order:
            if cap is None:
                run = probe.iteration()
                if rnd >= warmup:
                    runs.append({k: run[k] for k in (*PHASES, "ready")})
                continue
            trainer = trainers[cap]
            dist.barrier(group=ctx.group)
            row = timed_iteration(cfg.model, trainer.model, trainer.optimizer, probe.inputs, ctx)[0]
            if rnd >= warmup:
                ddp[cap].append({f"{k}_ms": row[f"{k}_ms"] for k in (*PHASES, "total")})
    return [dict(rank=ctx.rank, runs=runs, ddp=[ddp[cap] for cap in caps_mb])]


def _slowest_per_round(rows: list[dict], k: int, phase: str) -> list[float]:
    """Cap ``k``'s DDP ``phase`` per round, the slowest rank's (as a synchronized iteration takes)."""
    return [max(r[phase] for r in per_rank) for per_rank in zip(*(row["ddp"][k] for row in rows))]


def repeat(cfg: Config, probe: TrainConfig, index: int, root=None) -> list[dict]:
    """One probe and its interleaved job: a row per cap. Both calibrations are kept (``calibrations/``): the
    probe's, and the one with the interleaved compute that predicted."""
    from simulator.model.scenario import Scenario, predict
    from simulator.probe.calibrate import slowest_compute

    load = os.getloadavg()[0]
    cal, rows = _probe_and_interleave(cfg, probe, index)
    beside = dataclasses.replace(cal, profile=dataclasses.replace(cal.profile, **slowest_compute(rows)))
    for name, c in (("probe", cal), ("beside", beside)):
        c.save(results_root(root) / EXPERIMENT / "calibrations" / f"w{probe.world_size}-r{index}-{name}.json")
    out = []
    for k, cap in enumerate(cfg.caps_mb):
        measured = {p: statistics.median(_slowest_per_round(rows, k, f"{p}_ms")) for p in (*PHASES, "total")}
        pred, end_to_end = (predict(c, Scenario(bucket_cap_mb=cap)) for c in (beside, cal))
        out.append(
            dict(
                repeat=index,
                bucket_cap_mb=cap,
                buckets=pred["num_buckets"],
                measured_ms=measured["total"],
                predicted_ms=pred["predicted_ms"],
                error_pct=(pred["predicted_ms"] / measured["total"] - 1) * 100,
                end_to_end_ms=end_to_end["predicted_ms"],
                end_to_end_error_pct=(end_to_end["predicted_ms"] / measured["total"] - 1) * 100,
                **{f"measured_{p}_ms": measured[p] for p in PHASES},
                **{f"predicted_{p}_ms": pred[f"{p}_ms"] for p in PHASES},
                predicted_host_ms=pred["host_ms"],
                compute_ms=beside.profile.forward_ms + beside.profile.backward_ms + beside.profile.optimizer_ms,
                probe_compute_ms=cal.profile.forward_ms + cal.profile.backward_ms + cal.profile.optimizer_ms,
                host_per_gradient_us=cal.host_per_gradient_ms * 1e3,
                host_per_bucket_us=cal.host_per_bucket_ms * 1e3,
                alpha_ms=cal.comm.alpha_ms,
                rounds=cfg.rounds,
                model=cfg.model,
                world_size=probe.world_size,
                threads_per_rank=probe.threads_per_rank,
                net=cfg.net,
                load_before=load,
                calibration=cal.meta["created_at"],
                started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            )
        )
    return out


def _probe_and_interleave(cfg: Config, probe: TrainConfig, index: int) -> tuple:
    """A repeat's calibration probe, then its interleaved job on the same ranks: (the calibration, the ranks' rows)."""
    from experiments.tools.calibrations import announced
    from simulator.probe.calibrate import calibrate

    with announced(
        f"repeat {index + 1}/{cfg.repeats}: probing {probe.model} on {probe.world_size} rank(s)", EXPERIMENT
    ):
        cal = calibrate(probe)
    with announced(
        f"repeat {index + 1}/{cfg.repeats}: {cfg.rounds} interleaved rounds of no DDP and {len(cfg.caps_mb)} caps",
        EXPERIMENT,
    ):
        rows = run_point(probe, fn=interleaved_rank, fn_args=(list(cfg.caps_mb), cfg.rounds, cfg.warmup))
    return cal, rows


def summary(table: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per world size and cap: the median of the repeats' errors (each prediction against the measurement beside
    it) with its 95% bootstrap interval, the goal judged on that median; and, as ``make simval`` compares, the median
    prediction against the median measurement. Repeats differ in the host's speed (no DDP 25-52 ms an iteration
    within 15 minutes), so the medians of the two columns can come from different repeats: the paired one is the
    verdict."""
    rng, rows = np.random.default_rng(seed), []
    for (world_size, cap, buckets), g in table.groupby(["world_size", "bucket_cap_mb", "buckets"], sort=False):
        ratio = (g["predicted_ms"] / g["measured_ms"]).to_numpy()
        lo, hi = bootstrap_median_ci(ratio, rng)
        rows.append(
            dict(
                world_size=world_size,
                bucket_cap_mb=cap,
                buckets=buckets,
                repeats=len(g),
                error_pct=(np.median(ratio) - 1) * 100,
                ci_lo_pct=(lo - 1) * 100,
                ci_hi_pct=(hi - 1) * 100,
                repeat_lo_pct=g["error_pct"].min(),
                repeat_hi_pct=g["error_pct"].max(),
                medians_error_pct=(g["predicted_ms"].median() / g["measured_ms"].median() - 1) * 100,
                end_to_end_error_pct=(np.median(g["end_to_end_ms"] / g["measured_ms"]) - 1) * 100,
            )
        )
    out = pd.DataFrame(rows)
    out["within_goal"] = out["error_pct"].abs() <= GOAL_PCT
    return out


def run(cfg: Config, root=None) -> pd.DataFrame:
    with refusing():
        probes = check(cfg)
    path = results_root(root) / EXPERIMENT / "hostval.csv"
    rows: list[dict] = []
    for index in range(cfg.repeats):
        for probe in probes:  # the world sizes alternate, so that the host's drift reaches each alike
            rows += repeat(cfg, probe, index, root)
            write_csv_atomic(pd.DataFrame(rows), path)  # what is done stays if a later repeat is interrupted
            done = pd.DataFrame(rows[-len(cfg.caps_mb) :])
            print(
                f"[{EXPERIMENT}] repeat {index + 1}, {probe.world_size} rank(s): "
                + ", ".join(
                    f"{r.buckets} bucket(s) {r.predicted_ms:.1f} vs {r.measured_ms:.1f} ms ({r.error_pct:+.1f}%)"
                    for r in done.itertuples()
                ),
                file=sys.stderr,
                flush=True,
            )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    prog = "python -m experiments hostval"

    def body() -> int:
        cfg = parse_dataclass(Config, argv, prog=prog)
        table = summary(run(cfg))
        print(
            table.to_string(index=False, float_format=lambda x: f"{x:.1f}", formatters={"bucket_cap_mb": "{:g}".format})
        )
        print(
            f"{int(table['within_goal'].sum())} of {len(table)} (world size, cap) pairs predicted within "
            f"{GOAL_PCT:g}% (the median of {cfg.repeats} repeat(s)' errors); per repeat: "
            f"{results_root() / EXPERIMENT / 'hostval.csv'}"
        )
        return 0

    return command_line(prog, body)


if __name__ == "__main__":
    sys.exit(main())
