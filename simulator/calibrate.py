"""Calibrate the simulator on this machine as it is now: a short probe on a point's own ranks and network.

Why a probe instead of stored sweeps: this host's speed drifts between days (the same fig7 point took 386 ms one
day, 528 ms another), so absolute predictions need compute times measured now. The probe (20-45 s for ResNet50,
50-120 s for BERT-base) runs through ``harness.run_point(cfg, fn=probe_rank)``, on exactly the ranks, threads and
emulated link the point would be measured on, and measures on every rank at once (they share the cores, as in
training):

* compute: iterations without DDP: forward, backward, optimizer step, and each parameter's gradient-ready time
  (ddp_impl's hook on each gradient accumulator), the order and timing DDP's buckets follow; medians over the
  first iterations and the compute-only halves of the contention pairs, so that they span the probe; each one right
  after an iteration of DDP itself at the point's settings (a second replica), so that compute is timed beside
  training as the points then run it (kept for the record: DDP's own phases, and compute alone before any DDP
  iteration);
* communication: the allreduce microbenchmark of ``make fig2`` (:func:`harness.collectives.run_allreduce_point`),
  one call per iteration of 4 KiB up to the gradient's size (at most 128 MiB) on the point's link, fitted to the
  ring alpha-beta model (:func:`fit_link`) for the cost per byte; where ``make fig2`` has stored calls on this very
  link (same backend, ranks, host, torch and link rate, :func:`stored_link`), those are fitted instead and the
  probe skips its own;
* latency: backward passes that launch one allreduce per gradient, of its size, as it becomes ready (DDP's
  calls at cap 0, without DDP); the per-call cost is the one with which the simulator, given the link's cost
  per byte, reproduces when the last call finished (:func:`latency_from_calls`);
* contention: the backward alone and while one allreduce long enough to cover it runs, in pairs (what overlap
  costs the slowest rank's compute where communication runs on the same cores, and what the compute costs the
  allreduce's bytes);
* copies: DDP copies each gradient into its bucket and back out; the rank's memory-copy rate prices that.

The result is a :class:`Calibration`, stored as a versioned JSON file, so a prediction names what it came from.
:func:`refresh` re-times only what drifts, the compute (~30 s for BERT-base at 2 ranks against 50-120 s in full),
keeping a stored probe's link, per-call latency and contentions (``predict`` does so within a day of a full probe).
"""
from __future__ import annotations

import datetime
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ddp_impl.reducer import hook_accumulators
from harness import AllreduceConfig, TrainConfig, autorate, run_point
from harness.collectives import call_samples, run_allreduce_point
from harness.config import config_columns, validate
from harness.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.results import git_commit, load_results
from harness.runner import build_trainer, machine_metadata, timed_iteration

from .comm import AlphaBeta, Fit, concurrent_calls, fit_ring
from .iteration import ComputeProfile, buckets_for, simulate

VERSION = 10  # 10: contention from the slowest rank of each pair (8 took the ranks' median; 9 was reverted);
#               8: compute timed right after DDP iterations;
#               7: compute from the first iterations and the pairs' compute-only halves, spread over the probe;
#               6: alpha from per-gradient calls in backward, contention from interleaved pairs; 5: warm streams;
#               4: alpha from a stream of calls;
#               3: comm_contention; 2: probe sizes up to the gradient's (1 stopped at 32 MiB, and an emulated
#               link's burst made its fitted rate ~25% fast for DDP's buckets)
MIB = 1024 * 1024
PROBE_SIZES = (4 * 1024, 64 * 1024, MIB, 8 * MIB, 32 * MIB, 128 * MIB)  # bytes per allreduce call, up to ...
LATENCY_ITERS = 3  # backward passes with one allreduce per gradient (after one that warms them up)
CONTENTION_PAIRS = 3  # (backward alone, backward under an allreduce) pairs
PROBE_CALLS = 3  # timed calls per size, after one warm-up call (2 for calls of 32 MiB and more)
MAX_COVER_BYTES = 512 * 1024 * 1024  # the contention probe's allreduce never allocates more
STORED_LINK_LARGEST = 64 * MIB  # stored calls stand in for the probe's if their largest is min(gradient, this): an
#                                 emulated link's burst passes small calls fast, so the rate must come from large ones
STORED_LINK_RATE_TOLERANCE = 0.01  # ... and they ran on a link rate within 1% of the point's
DDP_PHASES = ("forward_ms", "backward_ms", "optimizer_ms", "total_ms")


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
    # compute alone before any DDP iteration
    ddp: dict = field(default_factory=dict)
    rest: dict = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        raw = json.loads(Path(path).read_text())
        if raw.get("meta", {}).get("version") != VERSION:
            raise ValueError(f"{path}: calibration version {raw.get('meta', {}).get('version')!r}, this code reads "
                             f"version {VERSION}; probe again")
        return cls(**{**raw, "profile": ComputeProfile(**raw["profile"]), "comm": AlphaBeta(**raw["comm"])})


def fit_link(samples, alpha_ms: float | None = None) -> Fit:
    """The ring model as DDP's buckets see the link: beta from a plain least-squares fit, which the large calls
    (the buckets that carry most bytes) decide; alpha as given (the probe's stream of calls) or else from the
    calls of at most 1 MiB. A fit of relative errors let an emulated link's burst (small calls pass at loopback
    speed) make the per-byte cost ~25% low for DDP's 25-100 MiB buckets. Quality is of the returned model."""
    beta = fit_ring(samples, relative=False).model.beta_ms_per_byte
    p = samples[0][0]
    if alpha_ms is None:
        small = [n for _, n, _ in samples if n <= MIB] or [min(n for _, n, _ in samples)]
        alpha_ms = _median((ms - 2 * (p - 1) / p * n * beta) / (2 * (p - 1))
                           for _, n, ms in samples if n <= max(small))
    model = AlphaBeta(max(0.0, alpha_ms), beta)
    y = np.array([ms for _, _, ms in samples])
    pred = np.array([model.allreduce_ms(n, p) for p, n, _ in samples])
    err = np.abs(pred - y) / y * 100
    r2 = 1 - float(((y - pred) ** 2).sum()) / float(((y - y.mean()) ** 2).sum())
    return Fit(model, r2, float(np.median(err)), float(err.max()), len(samples))


def _median(values) -> float:
    return float(statistics.median(values))


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


def probe_rank(ctx, cfg: TrainConfig, full: bool = True, link: tuple = ()) -> list[dict]:
    """One rank's probe (a ``run_point`` fn): compute, then the link (the given ``link`` samples instead, from
    :func:`stored_link`, where its calls reach the sizes the probe's would), then calls inside backward, then
    compute under communication; with ``full=False`` (:func:`compute_rank`) only the compute after DDP's
    iterations."""
    model = seeded_model(cfg.model, cfg.seed).to(ctx.device)
    inputs = make_inputs(cfg.model, input_spec(cfg.model, cfg.profile, cfg.batch_size), ctx.device,
                         seed=cfg.seed * 1000 + ctx.rank)
    params = [p for p in model.parameters() if p.requires_grad]
    stamps = [math.nan] * len(params)
    buffers = [torch.zeros_like(p) for p in params]  # what the latency probe reduces, one per gradient
    stream: dict = {}  # during a latency-probe backward: its calls and their completion times

    def on_ready(i: int) -> None:
        stamps[i] = time.perf_counter()
        if stream:  # DDP's calls at cap 0: one allreduce of each gradient's size, launched as it becomes ready
            work = dist.all_reduce(buffers[i], group=ctx.group, async_op=True)
            done = stream["done"]
            work.get_future().add_done_callback(lambda _f: done.append(time.perf_counter()))
            stream["calls"].append(work)

    accumulators, _ = hook_accumulators(params, lambda i: lambda *_: on_ready(i))  # DDP's own signal; held here
    optimizer = torch.optim.SGD(params, lr=cfg.lr)
    trainer = None  # DDP at the point's settings on a second replica: compute is timed right after its iterations
    if ctx.world_size > 1:
        trainer = build_trainer(seeded_model(cfg.model, cfg.seed).to(ctx.device), cfg, ctx)
    ddp_runs: list[dict] = []

    def after_ddp(cover: torch.Tensor | None = None) -> dict:
        """A compute-only iteration right after one of DDP at the point's settings (whose phases are kept)."""
        if trainer is not None:
            ddp_runs.append(timed_iteration(cfg.model, trainer.model, trainer.optimizer, inputs, ctx)[0])
        return iteration(cover)

    def iteration(cover: torch.Tensor | None = None, calls: bool = False) -> dict:
        dist.barrier(group=ctx.group)
        t0 = time.perf_counter()
        loss = compute_loss(cfg.model, model, inputs)
        ctx.synchronize()
        t1 = time.perf_counter()
        works = [] if cover is None else [dist.all_reduce(cover, group=ctx.group, async_op=True)]
        if calls:
            stream.update(calls=works, done=[])
        loss.backward()
        ctx.synchronize()
        t2 = time.perf_counter()
        done = stream.pop("done", [])
        stream.clear()
        for work in works:
            work.wait()
        covered = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        ctx.synchronize()
        t3 = time.perf_counter()
        return dict(forward=(t1 - t0) * 1e3, backward=(t2 - t1) * 1e3, optimizer=(t3 - covered) * 1e3,
                    ready=[(s - t1) * 1e3 for s in stamps], covered=(covered - t1) * 1e3,
                    calls_done=(max(done, default=t1) - t1) * 1e3)

    rest = [iteration() for _ in range(cfg.warmup + cfg.iters)][cfg.warmup:] if full else []  # before any DDP
    runs = [after_ddp() for _ in range(cfg.warmup + cfg.iters)][cfg.warmup:]  # compute alone, after DDP
    samples, calls_done, contention_pairs, comm_contention = [], math.nan, [], 0.0
    stored = False  # whether the link's samples are make fig2's (given as ``link``) rather than measured here
    if full:  # a refresh (compute_rank) re-times only the compute above
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        stored = max((n for _, n, _ in link), default=0) >= min(grad_bytes, STORED_LINK_LARGEST)
        samples = list(link) if stored else []
        # measured here: sizes up to the largest bucket DDP could send
        sizes = [] if stored else ([n for n in PROBE_SIZES if n < 2 * grad_bytes] or PROBE_SIZES[:2])
        for nbytes in sizes:  # fig2's microbenchmark, one call of nbytes per iteration, after one warm-up call
            n = nbytes // 4
            calls = AllreduceConfig(backend=ctx.backend, world_size=ctx.world_size, total_params=n,
                                    params_per_call=n, iters=PROBE_CALLS if nbytes < 32 * MIB else 2, warmup=1)
            samples += [(ctx.world_size, r["total_bytes"], r["call_ms"]) for r in run_allreduce_point(ctx, calls)]
        comm = fit_link(samples).model if ctx.world_size > 1 else AlphaBeta(0.0, 0.0)

        if ctx.world_size > 1:
            # What a call costs where DDP pays it: inside backward, one per gradient as it becomes ready, carrying
            # the gradient's bytes, while the ranks' compute threads hold the cores. Small calls alone (between
            # barriers, back to back, or inside backward) cost per call a factor 2-5 apart between rank counts and
            # runs on 2 cores, and several times what a call costs DDP while bytes flow. The first one warms up.
            streams = [iteration(calls=True) for _ in range(1 + LATENCY_ITERS)][1:]
            calls_done = _median(r["calls_done"] for r in streams)
            # Contention: backward alone and under one allreduce 1.5x as long, in pairs, so that drift between the
            # probe's phases (this host's speed moves within minutes) cancels.
            steps = 2 * (ctx.world_size - 1)
            per_byte = steps / ctx.world_size * comm.beta_ms_per_byte
            want = (1.5 * _median(r["backward"] for r in runs) - steps * comm.alpha_ms) / max(per_byte, 1e-12)
            size = torch.tensor([min(MAX_COVER_BYTES, max(32 * MIB, want))], dtype=torch.float64)
            dist.all_reduce(size, op=dist.ReduceOp.MAX, group=ctx.group)
            cover = torch.zeros(int(size.item()) // 4, dtype=torch.float32, device=ctx.device)
            pairs = [(after_ddp(), iteration(cover)) for _ in range(CONTENTION_PAIRS)]
            contention_pairs = [(alone["backward"], under["backward"]) for alone, under in pairs]
            # The allreduce ran over the whole backward; the time it took beyond its cost alone is what its bytes
            # lost while compute ran: a share x of the backward means they moved at rate 1 - x there.
            alone_ms = comm.allreduce_ms(cover.numel() * 4, ctx.world_size)
            lost = min(max(_median((r["covered"] - alone_ms) / r["backward"] for _, r in pairs), 0.0), 0.9)
            comm_contention = lost / (1 - lost)
            # The compute-only halves join the first iterations: a host's speed moves within minutes, and one slow
            # spell at the probe's start would otherwise set the compute of every prediction (most visibly where
            # no_sync leaves little else).
            runs += [alone for alone, _ in pairs]
    forward, backward, opt = (_median(r[k] for r in runs) for k in ("forward", "backward", "optimizer"))
    ready = [_median(r["ready"][i] for r in runs) for i in range(len(params))]

    grads = torch.cat([p.detach().reshape(-1) for p in params])
    copy = torch.empty_like(grads)
    copy_ms = []
    for _ in range(4):
        ctx.synchronize()
        t0 = time.perf_counter()
        copy.copy_(grads)
        ctx.synchronize()
        copy_ms.append((time.perf_counter() - t0) * 1e3)
    return [dict(rank=ctx.rank, backend=ctx.backend, forward_ms=forward, backward_ms=backward, optimizer_ms=opt,
                 ready_ms=ready, param_bytes=[p.numel() * p.element_size() for p in params],
                 contention_pairs=contention_pairs, comm_contention=comm_contention, calls_done_ms=calls_done,
                 comm_samples=samples, link="stored" if stored else "probed",
                 copy_ms_per_byte=_median(copy_ms[1:]) / (grads.numel() * grads.itemsize),
                 buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
                 # DDP's first iteration runs on the first bucket layout, the second rebuilds it in its forward
                 ddp={k: _median(r[k] for r in ddp_runs[max(2, cfg.warmup):]) for k in DDP_PHASES} if ddp_runs else {},
                 rest={f"{k}_ms": _median(r[k] for r in rest) for k in ("forward", "backward", "optimizer")} if rest
                 else {})]


def compute_rank(ctx, cfg: TrainConfig) -> list[dict]:
    """A refresh's probe (a ``run_point`` fn): only what drifts, compute timed right after DDP's iterations."""
    return probe_rank(ctx, cfg, full=False)


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
    lo, hi = 0.0, concurrent * done_ms / (2 * (world_size - 1))  # one call alone at hi already takes done_ms
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if last_done(mid) < done_ms else (lo, mid)
    return (lo + hi) / 2


def slowest_rank_contention(pairs_by_rank) -> float:
    """How much communication slows backward where DDP feels it: per contention pair, the slowest rank's backward
    under the allreduce over the slowest rank's backward alone, median over the pairs (0 without pairs). Ranks
    sharing cores do not slow alike (ResNet50, 2 ranks, 4 Gbit/s: 0.71 on one rank, 0.24 on the other), and DDP
    waits for the slowest, as the profile's ready times already do; the ranks' median read 0.35-0.60 there."""
    pairs = list(zip(*pairs_by_rank))  # per pair: each rank's (alone, under)
    if not pairs:
        return 0.0
    return max(0.0, _median(max(u for _, u in pair) / max(a for a, _ in pair) - 1 for pair in pairs))


def _slowest_compute(rows) -> dict:
    """The compute fields of a profile from every rank's probe. DDP waits for the slowest rank: a bucket is ready
    when its gradients are ready on every rank, and the buffer broadcast at the start of forward waits for the last
    rank's optimizer step; ranks sharing 2 cores differ by up to 1.5x in a phase (at 3 ranks: forward 72-114 ms,
    optimizer 27-39 ms)."""
    backward = max(r["backward_ms"] for r in rows)
    ready = [min(max(r["ready_ms"][i] for r in rows), backward) for i in range(len(rows[0]["ready_ms"]))]
    return dict(ready_ms=tuple(ready), backward_ms=backward, forward_ms=max(r["forward_ms"] for r in rows),
                optimizer_ms=max(r["optimizer_ms"] for r in rows))


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
    return replace(cal, profile=replace(cal.profile, **_slowest_compute(rows)), meta=meta, **_copy_and_ddp(rows))


def _copy_and_ddp(rows) -> dict:
    """The copy rate (ranks' median) and DDP's own phases (slowest rank), as a full probe and a refresh store them."""
    return dict(copy_ms_per_byte=_median(r["copy_ms_per_byte"] for r in rows),
                ddp={k: max(r["ddp"][k] for r in rows) for k in rows[0]["ddp"]})


def calibrate(cfg: TrainConfig, root=None) -> Calibration:
    """Probe ``cfg``'s ranks and network now (its ``iters``/``warmup`` set the compute iterations), the link's
    cost per byte from ``make fig2``'s stored calls on the same link where ``root``'s results hold them."""
    link = stored_link(cfg, root)
    rows = run_point(cfg, fn=probe_rank, fn_args=(True, link.samples if link else ()))
    profile = ComputeProfile(param_bytes=tuple(rows[0]["param_bytes"]), **_slowest_compute(rows),
                             contention=slowest_rank_contention([r["contention_pairs"] for r in rows]),
                             comm_contention=_median(r["comm_contention"] for r in rows))
    samples = [tuple(s) for s in rows[0]["comm_samples"]]
    fit, ring, calls_done = None, None, _median(r["calls_done_ms"] for r in rows)
    if cfg.world_size > 1:  # the bytes' cost from the link's calls, the per-call cost from the calls in backward
        ring = fit_link(samples)
        beta = ring.model.beta_ms_per_byte
        alpha = latency_from_calls(profile, calls_done, cfg.world_size, concurrent_calls(rows[0]["backend"]), beta)
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
        calls_done_ms=calls_done)  # what alpha reproduces: kept to re-derive it
    return Calibration(profile=profile, comm=fit.model if fit else AlphaBeta(0.0, 0.0), **_copy_and_ddp(rows),
                       buffer_bytes=int(rows[0]["buffer_bytes"]), point=point, fit=quality, meta=meta,
                       rest={k: max(r["rest"][k] for r in rows) for k in rows[0]["rest"]})
