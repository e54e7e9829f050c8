"""Calibrate the simulator on this machine as it is now: a short probe on a point's own ranks and network.

Why a probe instead of stored sweeps: this host's speed drifts between days (the same fig7 point took 386 ms one
day, 528 ms another), so absolute predictions need compute times measured now. The probe (20-45 s for ResNet50,
50-120 s for BERT-base) runs through ``harness.run_point(cfg, fn=probe_rank)``, on exactly the ranks, threads and
emulated link the point would be measured on, and measures on every rank at once (they share the cores, as in
training):

* compute: iterations without DDP: forward, backward, optimizer step, and each parameter's gradient-ready time
  (ddp_impl's hook on each gradient accumulator), the order and timing DDP's buckets follow; medians over the
  first iterations and the compute-only halves of the contention pairs, so that they span the probe; each one right
  after an iteration of DDP itself at the point's settings (a second replica; one rank too), so that compute is
  timed beside training as the points then run it (kept for the record: DDP's own phases, and compute alone before
  any DDP iteration);
* communication: the allreduce microbenchmark of ``make fig2``
  (:func:`harness.workloads.collectives.run_allreduce_point`), one call per iteration of 4 KiB up to the gradient's
  size (three sizes at least, up to 1 MiB; at most 128 MiB) on the point's link, fitted to the ring alpha-beta model
  (:func:`simulator.model.comm.fit_link`) for the cost per byte; where ``make fig2`` has stored calls on this very
  link (same backend, ranks, host, torch and link rate, :func:`stored_link`), those are fitted instead and the probe
  skips its own;
* latency: backward passes that launch one allreduce per gradient, of its size, as it becomes ready (DDP's
  calls at cap 0, without DDP); the per-call cost is the one with which the simulator, given the link's cost
  per byte, reproduces when the last call finished, and the share of the calls' latency that slows compute the one
  with which it reproduces when backward's compute ended beside them (:func:`~simulator.probe.call_fit.fit_calls`);
* contention: the backward alone and while one allreduce long enough to cover it runs, in pairs (what overlap
  costs the slowest rank's compute where communication runs on the same cores, and what the compute costs the
  allreduce's bytes);
* copies: DDP copies each gradient into its bucket and back out; the rank's memory-copy rate prices that;
* host work: DDP's cost per gradient and per bucket on backward's thread, from a host-bound stand-in model under the
  point's DDP at two bucket layouts against no DDP (:mod:`simulator.probe.stand_in`, about 3 s).

The result is a :class:`~simulator.model.calibration.Calibration`, stored as a versioned JSON file, so a prediction
names what it came from. :func:`refresh` re-times only what drifts, the compute (~30 s for BERT-base at 2 ranks
against 50-120 s in full), keeping a stored probe's link, per-call latency and contentions (``predict`` does so
within a day of a full probe).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace

from harness import TrainConfig, run_point
from harness.config import config_columns, validate
from harness.netem import autorate
from harness.results import git_commit, load_results
from harness.workloads.collectives import call_samples
from harness.workloads.runner import machine_metadata

from ..model.calibration import VERSION, Calibration
from ..model.comm import AlphaBeta, concurrent_calls, fit_link
from ..model.iteration import ComputeProfile
from . import stand_in
from .call_fit import fit_calls
from .rank import compute_rank, median, probe_rank

STORED_LINK_RATE_TOLERANCE = 0.01  # make fig2's calls stand in for the probe's on a link rate within 1% of the point's


@dataclass(frozen=True)
class StoredLink:
    """``make fig2``'s calls on one link, as fit samples, and where they came from."""

    samples: tuple[tuple[int, float, float], ...]
    source: str


def stored_link(cfg: TrainConfig, root=None) -> StoredLink | None:
    """The calls ``make fig2`` stored (``results/fig2``) on ``cfg``'s link: the same backend, ranks, emulated
    hosts, threads per rank, host and torch, and a link rate within ``STORED_LINK_RATE_TOLERANCE`` of the one
    the point gets now (``net=auto`` measures it, and the probe then reuses that rate); None if there are none, or
    only one call size. The link's cost does not drift with the host's compute speed, so any such run will do."""
    cfg = validate(cfg)
    df = load_results("fig2", root) if cfg.world_size > 1 else None
    if df is None or df.empty or "call_ms" not in df:
        return None
    rate, _ = autorate.point_rate(cfg)
    host = machine_metadata()
    ok = df[
        (df["point_type"] == "AllreduceConfig")
        & (df["error"].fillna("") == "")
        & (df["backend"] == cfg.backend)
        & (df["world_size"] == cfg.world_size)
        & (df["hosts"] == cfg.hosts)
        & (df["threads_per_rank"] == cfg.threads_per_rank)
        & (df["hostname"] == host["hostname"])
        & (df["torch_version"] == host["torch_version"])
    ]
    stored_rate = ok["net_rate_mbit"].astype(float)
    ok = (
        ok[stored_rate.isna()]
        if rate is None
        else ok[((stored_rate - rate).abs() <= STORED_LINK_RATE_TOLERANCE * rate).fillna(False)]
    )
    samples = call_samples(ok)
    if len({n for _, n, _ in samples}) < 2:
        return None
    link = "loopback" if rate is None else f"{ok['net_rate_mbit'].median():.0f} Mbit/s"
    return StoredLink(
        tuple(samples),
        f"make fig2's stored calls ({len(ok['point_id'].unique())} points on {link}, "
        f"{ok['started_at'].min()} to {ok['started_at'].max()})",
    )


def slowest_rank_contention(pairs_by_rank) -> float:
    """How much communication slows backward where DDP feels it: per contention pair, the slowest rank's backward
    under the allreduce over the slowest rank's backward alone, median over the pairs (0 without pairs). Ranks
    sharing cores do not slow alike (ResNet50, 2 ranks, 4 Gbit/s: 0.71 on one rank, 0.24 on the other), and DDP
    waits for the slowest, as the profile's ready times already do; the ranks' median read 0.35-0.60 there."""
    pairs = list(zip(*pairs_by_rank))  # per pair: each rank's (alone, under)
    if not pairs:
        return 0.0
    return max(0.0, median(max(u for _, u in pair) / max(a for a, _ in pair) - 1 for pair in pairs))


def slowest_compute(rows) -> dict:
    """The compute fields of a profile from every rank's probe iterations. DDP waits for the slowest rank in each
    iteration: a bucket is ready when its gradients are ready on every rank, and the buffer broadcast at the start
    of forward waits for the last rank's optimizer step. So each iteration's phases and ready times are the slowest
    rank's there (ready times and backward's end counted from the iterations' common start, then from the slowest
    forward's end), and the profile is their medians. Ranks sharing 2 cores differ by up to 1.5x in a phase, and
    not always the same rank: tiny-layers at 2 ranks took 53.6 ms an iteration by the slower rank per iteration,
    47.5 ms by the slower rank's medians."""
    iterations = []
    for runs in zip(*(r["runs"] for r in rows)):  # the ranks' k-th iterations, started together by a barrier
        forward = max(r["forward"] for r in runs)
        backward = max(r["forward"] + r["backward"] for r in runs) - forward
        ready = [
            min(max(r["forward"] + r["ready"][i] for r in runs) - forward, backward)
            for i in range(len(runs[0]["ready"]))
        ]
        iterations.append(
            dict(forward=forward, backward=backward, ready=ready, optimizer=max(r["optimizer"] for r in runs))
        )
    backward = median(it["backward"] for it in iterations)
    ready = [min(median(it["ready"][i] for it in iterations), backward) for i in range(len(iterations[0]["ready"]))]
    return dict(
        ready_ms=tuple(max(r, 0.0) for r in ready),
        backward_ms=backward,
        forward_ms=median(it["forward"] for it in iterations),
        optimizer_ms=median(it["optimizer"] for it in iterations),
    )


def refresh(cal: Calibration, cfg: TrainConfig) -> Calibration:
    """``cal``, a full probe of ``cfg``'s point, with what drifts measured again now (:func:`compute_rank`: forward,
    backward, optimizer step and each gradient's ready time, timed right after DDP's own iterations as in the full
    probe, but only ``cfg.iters`` of them, back to back, where a full probe adds its contention pairs' compute
    halves, later; and the copy rate); the link's cost, the per-call latency and the contentions stay as probed at
    ``meta["probed_at"]`` (an emulated link does not drift; ``make simval`` validates whole probes only)."""
    rows = run_point(cfg, fn=compute_rank)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = {
        **cal.meta,
        "created_at": now,
        "git_commit": git_commit(),
        "probed_at": cal.meta.get("probed_at", cal.meta["created_at"]),
        "probed_git_commit": cal.meta.get("probed_git_commit", cal.meta["git_commit"]),
    }
    return replace(cal, profile=replace(cal.profile, **slowest_compute(rows)), meta=meta, **_copy_and_ddp(rows))


def _copy_and_ddp(rows) -> dict:
    """The copy rate (ranks' median) and DDP's own phases (slowest rank), as a full probe and a refresh store them."""
    return dict(
        copy_ms_per_byte=median(r["copy_ms_per_byte"] for r in rows),
        ddp={k: max(r["ddp"][k] for r in rows) for k in rows[0]["ddp"]},
    )


def calibrate(cfg: TrainConfig, root=None) -> Calibration:
    """Probe ``cfg``'s ranks and network now (its ``iters``/``warmup`` set the compute iterations), the link's
    cost per byte from ``make fig2``'s stored calls on the same link where ``root``'s results hold them."""
    link = stored_link(cfg, root)
    rows = run_point(cfg, fn=probe_rank, fn_args=(True, link.samples if link else ()))
    profile = ComputeProfile(
        param_bytes=tuple(rows[0]["param_bytes"]),
        **slowest_compute(rows),
        contention=slowest_rank_contention([r["contention_pairs"] for r in rows]),
        comm_contention=median(r["comm_contention"] for r in rows),
    )
    source = link.source if rows[0]["link"] == "stored" else "probed now: make fig2's allreduce microbenchmark"
    fit = quality = None
    if cfg.world_size > 1:  # the bytes' cost from the link's calls, the per-call cost from the calls in backward
        profile, fit, quality = _fit_comm(profile, rows, cfg.world_size, source)
    point = {**config_columns(cfg), "net_rate_mbit": rows[0].get("net_rate_mbit"), "process_group": rows[0]["backend"]}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = dict(version=VERSION, created_at=now, git_commit=git_commit(), **machine_metadata())
    host = _slowest_host_cost(rows)
    return Calibration(
        profile=profile,
        comm=fit.model if fit else AlphaBeta(0.0, 0.0),
        **_copy_and_ddp(rows),
        buffer_bytes=int(rows[0]["buffer_bytes"]),
        point=point,
        fit=quality or {},
        meta=meta,
        compute_before_ddp={k: max(r["compute_before_ddp"][k] for r in rows) for k in rows[0]["compute_before_ddp"]},
        **host,
    )


def _fit_comm(profile: ComputeProfile, rows, world_size: int, source: str):
    """``(profile with its latency share, the link's fit, the fit's quality)`` from the ranks' calls (``source``:
    where the link's came from): the link's cost per byte from its calls, the per-call cost and the latency share
    from the calls inside backward."""
    samples = [tuple(s) for s in rows[0]["comm_samples"]]
    calls_done = median(median(r["calls_done_ms"]) for r in rows)
    # per pass the slowest rank's backward, as the profile's
    calls_backward = median(map(max, zip(*(r["calls_backward_ms"] for r in rows))))
    ring = fit_link(samples)
    beta = ring.model.beta_ms_per_byte
    alpha, share = fit_calls(
        profile, calls_done, calls_backward, world_size, concurrent_calls(rows[0]["backend"]), beta
    )
    profile = replace(profile, latency_contention=share)
    fit = fit_link(samples, alpha_ms=alpha)
    quality = dict(
        link=source,
        samples=fit.n,
        # the link's own ring fit (alpha from its small calls), as make fig2 reports it
        link_fit=dict(
            alpha_ms=ring.model.alpha_ms,
            gbit_per_s=ring.model.busbw_gbit,
            r2=ring.r2,
            median_abs_pct_error=ring.median_abs_pct_error,
            worst_abs_pct_error=ring.worst_abs_pct_error,
        ),
        # the model used (alpha from the calls inside backward) against the same calls
        r2=fit.r2,
        median_abs_pct_error=fit.median_abs_pct_error,
        worst_abs_pct_error=fit.worst_abs_pct_error,
        calls_done_ms=calls_done,
        calls_backward_ms=calls_backward,  # what alpha and the share reproduce
        host_cost=[r["host_cost"] for r in rows],  # each rank's stand-in backwards, per variant and round
    )
    return profile, fit, quality


def _slowest_host_cost(rows) -> dict:
    """DDP's host work per gradient and per bucket (per round the slowest rank's: DDP waits for it); 0 without a
    probe of it."""
    found = [r["host_cost"] for r in rows if r.get("host_cost")]
    if not found:
        return dict(host_per_gradient_ms=0.0, host_per_bucket_ms=0.0)
    cost = stand_in.slowest(found)
    return dict(host_per_gradient_ms=cost.per_gradient_ms, host_per_bucket_ms=cost.per_bucket_ms)
