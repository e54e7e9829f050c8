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
* communication: the allreduce microbenchmark of ``make fig2`` (:func:`harness.collectives.run_allreduce_point`),
  one call per iteration of 4 KiB up to the gradient's size (three sizes at least, up to 1 MiB; at most 128 MiB)
  on the point's link, fitted to the ring alpha-beta model (:func:`simulator.comm.fit_link`) for the cost per byte;
  where ``make fig2`` has stored calls on this very link (same backend, ranks, host, torch and link rate,
  :func:`stored_link`), those are fitted instead and the probe skips its own;
* latency: backward passes that launch one allreduce per gradient, of its size, as it becomes ready (DDP's
  calls at cap 0, without DDP); the per-call cost is the one with which the simulator, given the link's cost
  per byte, reproduces when the last call finished, and the share of the calls' latency that slows compute the one
  with which it reproduces when backward's compute ended beside them (:func:`fit_calls`);
* contention: the backward alone and while one allreduce long enough to cover it runs, in pairs (what overlap
  costs the slowest rank's compute where communication runs on the same cores, and what the compute costs the
  allreduce's bytes);
* copies: DDP copies each gradient into its bucket and back out; the rank's memory-copy rate prices that;
* host work: DDP's cost per gradient and per bucket on backward's thread, from a host-bound stand-in model under the
  point's DDP at two bucket layouts against no DDP (:mod:`simulator.host_cost`, about 3 s).

The result is a :class:`Calibration`, stored as a versioned JSON file, so a prediction names what it came from.
:func:`refresh` re-times only what drifts, the compute (~30 s for BERT-base at 2 ranks against 50-120 s in full),
keeping a stored probe's link, per-call latency and contentions (``predict`` does so within a day of a full probe).
"""
from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness import TrainConfig, autorate, run_point
from harness.collectives import call_samples
from harness.config import config_columns, validate
from harness.results import git_commit, load_results
from harness.runner import machine_metadata

from . import host_cost
from .comm import AlphaBeta, concurrent_calls, fit_link
from .iteration import ComputeProfile, buckets_for, simulate
from .probe import compute_rank, median, probe_rank

VERSION = 16  # changes whenever what the probe measures, or how, changes: a stored calibration of another version is
#               refused (Calibration.load), so a prediction never mixes numbers measured two ways
# earlier versions whose files differ only by fields added since, whose defaults give what they predicted then
EARLIER_READABLE = {10: "no host cost (0: the probe did not measure it)",
                    11: "3 latency passes and 3 contention pairs (9 and 7 since)",
                    12: "no latency contention (0: calls waiting out their latency cost compute nothing)",
                    13: "compute as the slowest rank's medians (since: the slowest rank in each iteration)",
                    14: "host cost from 400 Linear(8, 8) gradients (since: the point's model's parameters)",
                    15: "host cost per bucket from one bucket per gradient (since: buckets of about 10 gradients), "
                        "compute at one rank timed back to back (since: after DDP's iterations)"}
FIT_ROUNDS = 30  # at most, of fit_calls' turns
STORED_LINK_RATE_TOLERANCE = 0.01  # make fig2's calls stand in for the probe's on a link rate within 1% of the point's


@dataclass(frozen=True)
class Calibration:
    """Everything a prediction for one (model, profile, ranks, network, threads) on this machine needs."""

    profile: ComputeProfile
    comm: AlphaBeta
    copy_ms_per_byte: float  # one memory copy of a gradient, per byte
    buffer_bytes: int  # broadcast by DDP before every forward (broadcast_buffers=True)
    point: dict  # the probed point's config columns, plus the network rate and the backend ("process_group") used
    fit: dict  # the alpha-beta fit's quality: r2, median/worst % error, samples
    meta: dict  # version, time, machine, git commit: what a prediction says it used
    # for the record, not used by predictions (slowest rank's medians): DDP's own phases beside the probe, and
    # compute alone before any DDP iteration (load() also reads files that name it "rest")
    ddp: dict = field(default_factory=dict)
    compute_before_ddp: dict = field(default_factory=dict)
    # DDP's own host work on backward's thread (simulator.predict.with_host_overhead): the probe's host-bound stand-in
    # on the point's ranks (simulator.host_cost), or a named cluster's stated numbers
    host_per_gradient_ms: float = 0.0
    host_per_bucket_ms: float = 0.0

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, stored_run: bool = False) -> "Calibration":
        """``stored_run``: read to draw a stored run again, where a calibration of an earlier version that this one
        only adds fields to (:data:`EARLIER_READABLE`) also loads, as it predicted then."""
        raw = json.loads(Path(path).read_text())
        version = raw.get("meta", {}).get("version")
        if version != VERSION and not (stored_run and version in EARLIER_READABLE):
            raise ValueError(f"{path}: calibration version {raw.get('meta', {}).get('version')!r}, this code reads "
                             f"version {VERSION}; probe again")
        if "rest" in raw:
            raw["compute_before_ddp"] = raw.pop("rest")
        return cls(**{**raw, "profile": ComputeProfile(**raw["profile"]), "comm": AlphaBeta(**raw["comm"])})


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
    ok = df[(df["point_type"] == "AllreduceConfig") & (df["error"].fillna("") == "") & (df["backend"] == cfg.backend)
            & (df["world_size"] == cfg.world_size) & (df["hosts"] == cfg.hosts)
            & (df["threads_per_rank"] == cfg.threads_per_rank) & (df["hostname"] == host["hostname"])
            & (df["torch_version"] == host["torch_version"])]
    stored_rate = ok["net_rate_mbit"].astype(float)
    ok = ok[stored_rate.isna()] if rate is None else \
        ok[((stored_rate - rate).abs() <= STORED_LINK_RATE_TOLERANCE * rate).fillna(False)]
    samples = call_samples(ok)
    if len({n for _, n, _ in samples}) < 2:
        return None
    link = "loopback" if rate is None else f"{ok['net_rate_mbit'].median():.0f} Mbit/s"
    return StoredLink(tuple(samples), f"make fig2's stored calls ({len(ok['point_id'].unique())} points on {link}, "
                                     f"{ok['started_at'].min()} to {ok['started_at'].max()})")


def latency_from_calls(profile: ComputeProfile, done_ms: float, world_size: int, concurrent: int = 1,
                       beta_ms_per_byte: float = 0.0) -> float:
    """The per-step latency alpha with which the simulator reproduces ``done_ms``: when the last of one
    allreduce per gradient (its size, at ``beta_ms_per_byte``), each launched as its gradient became ready,
    completed. 0 if the bytes alone already take that long."""
    buckets = buckets_for(profile, 0.0)  # one per gradient, in ready order

    def last_done(alpha_ms: float) -> float:
        comm = AlphaBeta(alpha_ms, beta_ms_per_byte)
        return max(simulate(profile, buckets, comm, world_size, concurrent=concurrent).done_ms)

    if world_size < 2 or last_done(0.0) >= done_ms:
        return 0.0
    hi = concurrent * done_ms / (2 * (world_size - 1))  # one call alone at hi already takes done_ms
    return _bisect(last_done, done_ms, hi, rel=1e-3)


def _bisect(fn, target: float, hi: float, rel: float = 0.0, abs_: float = 0.0) -> float:
    """The x in [0, hi] where the increasing ``fn`` reaches ``target``, to ``abs_`` or ``rel`` x the bracket's top."""
    lo = 0.0
    while hi - lo > max(abs_, rel * hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
    return (lo + hi) / 2


def latency_share_from_calls(profile: ComputeProfile, backward_ms: float, world_size: int, comm: AlphaBeta,
                             concurrent: int = 1) -> float:
    """The ``latency_contention`` with which the simulator's backward compute, beside one allreduce per gradient
    launched as each is ready, ends at ``backward_ms`` as measured (0 to 1; 0 without contention)."""
    buckets = buckets_for(profile, 0.0)

    def compute_end(share: float) -> float:
        return simulate(replace(profile, latency_contention=share), buckets, comm, world_size,
                        concurrent=concurrent).compute_end_ms

    if world_size < 2 or not profile.contention or compute_end(0.0) >= backward_ms:
        return 0.0
    if compute_end(1.0) <= backward_ms:
        return 1.0
    return _bisect(compute_end, backward_ms, 1.0, abs_=1e-3)


def fit_calls(profile: ComputeProfile, done_ms: float, backward_ms: float, world_size: int, concurrent: int = 1,
              beta_ms_per_byte: float = 0.0) -> tuple[float, float]:
    """``(alpha, latency_contention)`` from the probe's calls inside backward: alpha reproduces when the last call
    finished, the share when backward's compute ended beside them. Each moves the other (a slower compute readies
    gradients later, so the calls need less latency to end when they did): fitted in turn until both settle."""
    alpha, share = latency_from_calls(profile, done_ms, world_size, concurrent, beta_ms_per_byte), 0.0
    for _ in range(FIT_ROUNDS):
        share_now = latency_share_from_calls(profile, backward_ms, world_size, AlphaBeta(alpha, beta_ms_per_byte),
                                             concurrent)
        alpha_now = latency_from_calls(replace(profile, latency_contention=share_now), done_ms, world_size,
                                       concurrent, beta_ms_per_byte)
        settled = abs(share_now - share) <= 1e-3 and abs(alpha_now - alpha) <= 1e-3 * alpha
        alpha, share = alpha_now, share_now
        if settled:
            break
    return alpha, share


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
        ready = [min(max(r["forward"] + r["ready"][i] for r in runs) - forward, backward)
                 for i in range(len(runs[0]["ready"]))]
        iterations.append(dict(forward=forward, backward=backward, ready=ready,
                               optimizer=max(r["optimizer"] for r in runs)))
    backward = median(it["backward"] for it in iterations)
    ready = [min(median(it["ready"][i] for it in iterations), backward) for i in range(len(iterations[0]["ready"]))]
    return dict(ready_ms=tuple(max(r, 0.0) for r in ready), backward_ms=backward,
                forward_ms=median(it["forward"] for it in iterations),
                optimizer_ms=median(it["optimizer"] for it in iterations))


def refresh(cal: Calibration, cfg: TrainConfig) -> Calibration:
    """``cal``, a full probe of ``cfg``'s point, with what drifts measured again now (:func:`compute_rank`: forward,
    backward, optimizer step and each gradient's ready time, timed right after DDP's own iterations as in the full
    probe, but only ``cfg.iters`` of them, back to back, where a full probe adds its contention pairs' compute
    halves, later; and the copy rate); the link's cost, the per-call latency and the contentions stay as probed at
    ``meta["probed_at"]`` (an emulated link does not drift; ``make simval`` validates whole probes only)."""
    rows = run_point(cfg, fn=compute_rank)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = {**cal.meta, "created_at": now, "git_commit": git_commit(),
            "probed_at": cal.meta.get("probed_at", cal.meta["created_at"]),
            "probed_git_commit": cal.meta.get("probed_git_commit", cal.meta["git_commit"])}
    return replace(cal, profile=replace(cal.profile, **slowest_compute(rows)), meta=meta, **_copy_and_ddp(rows))


def _copy_and_ddp(rows) -> dict:
    """The copy rate (ranks' median) and DDP's own phases (slowest rank), as a full probe and a refresh store them."""
    return dict(copy_ms_per_byte=median(r["copy_ms_per_byte"] for r in rows),
                ddp={k: max(r["ddp"][k] for r in rows) for k in rows[0]["ddp"]})


def calibrate(cfg: TrainConfig, root=None) -> Calibration:
    """Probe ``cfg``'s ranks and network now (its ``iters``/``warmup`` set the compute iterations), the link's
    cost per byte from ``make fig2``'s stored calls on the same link where ``root``'s results hold them."""
    link = stored_link(cfg, root)
    rows = run_point(cfg, fn=probe_rank, fn_args=(True, link.samples if link else ()))
    profile = ComputeProfile(param_bytes=tuple(rows[0]["param_bytes"]), **slowest_compute(rows),
                             contention=slowest_rank_contention([r["contention_pairs"] for r in rows]),
                             comm_contention=median(r["comm_contention"] for r in rows))
    samples = [tuple(s) for s in rows[0]["comm_samples"]]
    fit = ring = calls_done = calls_backward = None
    if cfg.world_size > 1:  # the bytes' cost from the link's calls, the per-call cost from the calls in backward
        calls_done = median(median(r["calls_done_ms"]) for r in rows)
        # per pass the slowest rank's backward, as the profile's
        calls_backward = median(map(max, zip(*(r["calls_backward_ms"] for r in rows))))
        ring = fit_link(samples)
        beta = ring.model.beta_ms_per_byte
        alpha, share = fit_calls(profile, calls_done, calls_backward, cfg.world_size,
                                 concurrent_calls(rows[0]["backend"]), beta)
        profile = replace(profile, latency_contention=share)
        fit = fit_link(samples, alpha_ms=alpha)
    point = {**config_columns(cfg), "net_rate_mbit": rows[0].get("net_rate_mbit"), "process_group": rows[0]["backend"]}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = dict(version=VERSION, created_at=now, git_commit=git_commit(), **machine_metadata())
    source = link.source if rows[0]["link"] == "stored" else "probed now: make fig2's allreduce microbenchmark"
    quality = {} if fit is None else dict(
        link=source, samples=fit.n,
        # the link's own ring fit (alpha from its small calls), as make fig2 reports it
        link_fit=dict(alpha_ms=ring.model.alpha_ms, gbit_per_s=ring.model.busbw_gbit, r2=ring.r2,
                      median_abs_pct_error=ring.median_abs_pct_error, worst_abs_pct_error=ring.worst_abs_pct_error),
        # the model used (alpha from the calls inside backward) against the same calls
        r2=fit.r2, median_abs_pct_error=fit.median_abs_pct_error, worst_abs_pct_error=fit.worst_abs_pct_error,
        calls_done_ms=calls_done, calls_backward_ms=calls_backward,  # what alpha and the share reproduce
        host_cost=[r["host_cost"] for r in rows])  # each rank's stand-in backwards, per variant and round
    host = _slowest_host_cost(rows)
    return Calibration(profile=profile, comm=fit.model if fit else AlphaBeta(0.0, 0.0), **_copy_and_ddp(rows),
                       buffer_bytes=int(rows[0]["buffer_bytes"]), point=point, fit=quality, meta=meta,
                       compute_before_ddp={k: max(r["compute_before_ddp"][k] for r in rows)
                                           for k in rows[0]["compute_before_ddp"]}, **host)


def _slowest_host_cost(rows) -> dict:
    """DDP's host work per gradient and per bucket (per round the slowest rank's: DDP waits for it); 0 without a
    probe of it."""
    found = [r["host_cost"] for r in rows if r.get("host_cost")]
    if not found:
        return dict(host_per_gradient_ms=0.0, host_per_bucket_ms=0.0)
    cost = host_cost.slowest(found)
    return dict(host_per_gradient_ms=cost.per_gradient_ms, host_per_bucket_ms=cost.per_bucket_ms)
