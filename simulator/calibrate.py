"""Calibrate the simulator on this machine as it is now: a short probe on a point's own ranks and network.

Why a probe instead of stored sweeps: this host's speed drifts between days (the same fig7 point took 386 ms one
day, 528 ms another), so absolute predictions need compute times measured now. The probe (well under a minute)
runs through ``harness.run_point(cfg, fn=probe_rank)``, on exactly the ranks, threads and emulated link the point
would be measured on, and measures on every rank at once (they share the cores, as in training):

* compute: iterations without DDP: forward, backward, optimizer step, and each parameter's gradient-ready time
  (post-accumulate-grad hooks), the order and timing DDP's buckets follow;
* communication: allreduces of 4 KiB up to the gradient's size (at most 128 MiB) on the point's link, fitted
  to the ring alpha-beta model (:func:`fit_link`);
* contention: the backward again while one allreduce long enough to cover it runs (what overlap costs the
  compute where communication runs on the same cores, and what the compute costs the allreduce's bytes);
* copies: DDP copies each gradient into its bucket and back out; the rank's memory-copy rate prices that.

The result is a :class:`Calibration`, stored as a versioned JSON file, so a prediction names what it came from.
"""
from __future__ import annotations

import datetime
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from harness import TrainConfig, run_point
from harness.config import config_columns
from harness.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.results import git_commit
from harness.runner import machine_metadata

from .comm import AlphaBeta, Fit, fit_ring
from .iteration import ComputeProfile

VERSION = 5  # 5: alpha from warm streams (the first is 5-7x slower); 4: alpha from a stream of calls;
#              3: comm_contention; 2: probe sizes up to the gradient's (1 stopped at 32 MiB, and an emulated
#              link's burst made its fitted rate ~25% fast for DDP's buckets)
MIB = 1024 * 1024
PROBE_SIZES = (4 * 1024, 64 * 1024, MIB, 8 * MIB, 32 * MIB, 128 * MIB)  # bytes per allreduce call, up to ...
STREAM_CALLS = 64  # 4 KiB calls launched back to back: the per-call latency DDP's buckets pay
STREAMS = 4  # streams timed; the first only warms the calls up
PROBE_CALLS = 3  # timed calls per size, after one warm-up call (2 for calls of 32 MiB and more)
MAX_COVER_BYTES = 512 * 1024 * 1024  # the contention probe's allreduce never allocates more


@dataclass(frozen=True)
class Calibration:
    """Everything a prediction for one (model, profile, ranks, network, threads) on this machine needs."""

    profile: ComputeProfile
    comm: AlphaBeta
    copy_ms_per_byte: float  # one memory copy of a gradient, per byte
    buffer_bytes: int  # broadcast by DDP before every forward (broadcast_buffers=True)
    point: dict  # the probed point's config columns, plus the network rate used
    fit: dict  # the alpha-beta fit's quality: r2, median/worst % error, samples
    meta: dict  # version, time, machine, git commit: what a prediction says it used

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


def _timed_allreduce(buf: torch.Tensor, ctx) -> float:
    dist.barrier(group=ctx.group)
    t0 = time.perf_counter()
    dist.all_reduce(buf, group=ctx.group)
    ctx.synchronize()
    return (time.perf_counter() - t0) * 1e3


def probe_rank(ctx, cfg: TrainConfig) -> list[dict]:
    """One rank's probe (a ``run_point`` fn): compute, then communication, then compute under communication."""
    model = seeded_model(cfg.model, cfg.seed).to(ctx.device)
    inputs = make_inputs(cfg.model, input_spec(cfg.model, cfg.profile, cfg.batch_size), ctx.device,
                         seed=cfg.seed * 1000 + ctx.rank)
    params = [p for p in model.parameters() if p.requires_grad]
    stamps = [math.nan] * len(params)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: stamps.__setitem__(i, time.perf_counter()))
    optimizer = torch.optim.SGD(params, lr=cfg.lr)

    def iteration(cover: torch.Tensor | None = None) -> tuple[float, float, float, list[float], float]:
        dist.barrier(group=ctx.group)
        t0 = time.perf_counter()
        loss = compute_loss(cfg.model, model, inputs)
        ctx.synchronize()
        t1 = time.perf_counter()
        work = None if cover is None else dist.all_reduce(cover, group=ctx.group, async_op=True)
        loss.backward()
        ctx.synchronize()
        t2 = time.perf_counter()
        if work is not None:
            work.wait()
        covered = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        ctx.synchronize()
        t3 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - covered) * 1e3, [(s - t1) * 1e3 for s in stamps], \
            (covered - t1) * 1e3

    runs = [iteration() for _ in range(cfg.warmup + cfg.iters)][cfg.warmup:]
    forward, backward, opt = (_median(r[k] for r in runs) for k in range(3))
    ready = [_median(r[3][i] for r in runs) for i in range(len(params))]

    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    samples = []
    for nbytes in [n for n in PROBE_SIZES if n < 2 * grad_bytes] or PROBE_SIZES[:2]:  # ... the largest bucket
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=ctx.device)
        calls = PROBE_CALLS if nbytes < 32 * MIB else 2
        times = [_timed_allreduce(buf, ctx) for _ in range(calls + 1)][1:]
        samples += [(ctx.world_size, nbytes, ms) for ms in times]
        del buf
    comm = fit_link(samples).model if ctx.world_size > 1 else AlphaBeta(0.0, 0.0)
    # A stream of small calls launched back to back, as DDP launches its buckets: what one call adds there
    # (barrier-separated calls also pay each round trip's wake-up, which a stream overlaps).
    # The first stream in a process runs 5-7x slower per call (0.2-0.3 ms warm, 1.6 ms cold at 2 ranks), and
    # DDP's calls are warm: the median of the streams after the first.
    stream = torch.zeros(STREAM_CALLS * 1024, dtype=torch.float32, device=ctx.device).split(1024)
    stream_ms = []
    for _ in range(STREAMS):
        dist.barrier(group=ctx.group)
        t0 = time.perf_counter()
        for work in [dist.all_reduce(chunk, group=ctx.group, async_op=True) for chunk in stream]:
            work.wait()
        ctx.synchronize()
        stream_ms.append((time.perf_counter() - t0) * 1e3 / STREAM_CALLS)
    stream_call_ms = _median(stream_ms[1:])

    contended, comm_contention = backward, 0.0
    if ctx.world_size > 1:  # an allreduce 1.5x as long as the backward, the same size on every rank
        steps = 2 * (ctx.world_size - 1)
        want = (1.5 * backward - steps * comm.alpha_ms) / max(steps / ctx.world_size * comm.beta_ms_per_byte, 1e-12)
        size = torch.tensor([min(MAX_COVER_BYTES, max(32 * MIB, want))], dtype=torch.float64)
        dist.all_reduce(size, op=dist.ReduceOp.MAX, group=ctx.group)
        cover = torch.zeros(int(size.item()) // 4, dtype=torch.float32, device=ctx.device)
        runs = [iteration(cover) for _ in range(max(2, cfg.iters // 2))]
        contended = _median(r[1] for r in runs)
        # The allreduce ran over the whole backward; the time it took beyond its cost alone is what its bytes
        # lost while compute ran: a share x of the backward means they moved at rate 1 - x there.
        lost = (_median(r[4] for r in runs) - comm.allreduce_ms(cover.numel() * 4, ctx.world_size)) / contended
        lost = min(max(lost, 0.0), 0.9)
        comm_contention = lost / (1 - lost)

    grads = torch.cat([p.detach().reshape(-1) for p in params])
    copy = torch.empty_like(grads)
    copy_ms = []
    for _ in range(4):
        ctx.synchronize()
        t0 = time.perf_counter()
        copy.copy_(grads)
        ctx.synchronize()
        copy_ms.append((time.perf_counter() - t0) * 1e3)
    return [dict(rank=ctx.rank, forward_ms=forward, backward_ms=backward, optimizer_ms=opt, ready_ms=ready,
                 param_bytes=[p.numel() * p.element_size() for p in params], contended_backward_ms=contended,
                 comm_contention=comm_contention, stream_call_ms=stream_call_ms,
                 comm_samples=samples, copy_ms_per_byte=_median(copy_ms[1:]) / (grads.numel() * grads.itemsize),
                 buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()))]


def calibrate(cfg: TrainConfig) -> Calibration:
    """Probe ``cfg``'s ranks and network now (its ``iters``/``warmup`` set the compute iterations)."""
    rows = run_point(cfg, fn=probe_rank)
    # DDP waits for the slowest rank: a bucket is ready when its gradients are ready on every rank.
    ready = [max(r["ready_ms"][i] for r in rows) for i in range(len(rows[0]["ready_ms"]))]
    backward = max(r["backward_ms"] for r in rows)
    contended = max(r["contended_backward_ms"] for r in rows)
    samples = [tuple(s) for s in rows[0]["comm_samples"]]
    fit = None
    if cfg.world_size > 1:  # alpha as a stream of DDP's calls pays it (4 KiB calls: the bytes term is negligible)
        fit = fit_link(samples, alpha_ms=_median(r["stream_call_ms"] for r in rows) / (2 * (cfg.world_size - 1)))
    profile = ComputeProfile(param_bytes=tuple(rows[0]["param_bytes"]), backward_ms=backward,
                             ready_ms=tuple(min(r, backward) for r in ready),
                             forward_ms=_median(r["forward_ms"] for r in rows),
                             optimizer_ms=_median(r["optimizer_ms"] for r in rows),
                             contention=max(0.0, contended / backward - 1),
                             comm_contention=_median(r["comm_contention"] for r in rows))
    point = {**config_columns(cfg), "net_rate_mbit": rows[0].get("net_rate_mbit")}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = dict(version=VERSION, created_at=now, git_commit=git_commit(), **machine_metadata())
    quality = {} if fit is None else dict(r2=fit.r2, median_abs_pct_error=fit.median_abs_pct_error,
                                          worst_abs_pct_error=fit.worst_abs_pct_error, samples=fit.n)
    return Calibration(profile=profile, comm=fit.model if fit else AlphaBeta(0.0, 0.0),
                       copy_ms_per_byte=_median(r["copy_ms_per_byte"] for r in rows),
                       buffer_bytes=int(rows[0]["buffer_bytes"]), point=point, fit=quality, meta=meta)
