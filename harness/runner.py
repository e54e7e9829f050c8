"""Time training iterations on one rank: ours, torch's DDP, or no DDP, all by the same loop.

Every iteration is bracketed by host clocks (with ``torch.cuda.synchronize`` on GPU): forward (incl. loss),
backward, optimizer step (incl. zero_grad). The split of backward into compute and exposed communication
comes from the DDP implementation's own instrumentation:

* ``ours``: ``ddp.last_timing.as_dict()`` (plus per-bucket launch/finish timestamps).
* ``torch``: torch's DDP logger. With ``_set_ddp_runtime_logging_sample_rate(1)`` torch samples every
  synchronized iteration, but only stores an iteration's stats at the *next* synchronized forward. Checked
  empirically with torch 2.14: calling ``ddp.logger.set_runtime_stats_and_log()`` right after backward stores
  the current iteration, and ``_get_ddp_logging_data()["iteration"]`` advances by one per synchronized
  iteration. The runner calls it after the iteration's clocks stop, and if ``iteration`` did not advance
  (a torch without that behaviour) it falls back to host timers: backward_compute_ms = whole backward,
  exposed comm unknown (NaN); ``breakdown_source`` says which was used.
* ``local`` and iterations inside ``no_sync()``: no communication, so backward compute = host backward and
  exposed comm = 0 (``breakdown_source = host``).

With ``sync_every = n``, iteration ``i`` (counted from the first warmup iteration) synchronizes when
``(i + 1) % n == 0``; the optimizer steps only on synchronized iterations (gradient accumulation).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import math
import socket
import time

import torch

from harness.config import TrainConfig
from harness.launch import RankContext, inject_fault
from harness.models import build_model, compute_loss, input_spec, make_inputs

NS_PER_MS = 1e6


def _comm_hook(name: str):
    """torch's own hook for a COMM_HOOKS name; both DDPs take it through ``register_comm_hook``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return getattr(default_hooks, f"{name}_hook")


def wrap_model(model: torch.nn.Module, cfg: TrainConfig, ctx: RankContext):
    """Wrap ``model`` as ``cfg.impl`` says; returns the module to train."""
    if cfg.impl == "local":
        return model
    if cfg.impl == "torch":
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            process_group=ctx.group, bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
        )
        ddp._set_ddp_runtime_logging_sample_rate(1)
    else:
        from ddp_impl import DistributedDataParallel, RoundRobinProcessGroup

        group = ctx.group
        if cfg.round_robin_groups > 1:
            group = RoundRobinProcessGroup.new(cfg.round_robin_groups,
                                               timeout=datetime.timedelta(seconds=ctx.timeout_s))
        ddp = DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=cfg.bucket_cap_mb, overlap=cfg.overlap,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view)
    if cfg.comm_hook:  # ours resolves a round-robin group given as state to each bucket's group
        ddp.register_comm_hook(ddp.process_group, _comm_hook(cfg.comm_hook))
    return ddp


class _Breakdown:
    """Reads the backward compute / communication split after each iteration, per implementation."""

    def __init__(self, impl: str, model):
        self.impl, self.model = impl, model
        self.last_seen = None  # torch: logger iteration; ours: last IterationTiming object

    def read(self, synced: bool, backward_ms: float) -> dict:
        nan = math.nan
        out = dict(backward_compute_ms=backward_ms, backward_comm_exposed_ms=0.0, ddp_forward_compute_ms=nan,
                   ddp_backward_compute_ms=nan, ddp_backward_comm_ms=nan, ddp_overlap_ms=nan,
                   bucket_times_json="", breakdown_source="host")
        if self.impl == "local" or not synced:
            return out
        if self.impl == "torch":
            return self._torch(out)
        return self._ours(out)

    def _torch(self, out: dict) -> dict:
        try:
            self.model.logger.set_runtime_stats_and_log()
        except (AttributeError, RuntimeError):
            pass
        data = self.model._get_ddp_logging_data()
        iteration = data.get("iteration")
        if iteration is None or iteration == self.last_seen or "backward_comm_time" not in data:
            out["backward_comm_exposed_ms"] = math.nan
            return out
        self.last_seen = iteration
        comm = data["backward_comm_time"] / NS_PER_MS
        overlap = data["backward_compute_comm_overlap_time"] / NS_PER_MS
        out.update(ddp_forward_compute_ms=data["forward_compute_time"] / NS_PER_MS,
                   ddp_backward_compute_ms=data["backward_compute_time"] / NS_PER_MS,
                   ddp_backward_comm_ms=comm, ddp_overlap_ms=overlap, breakdown_source="torch_logger")
        out.update(backward_compute_ms=out["ddp_backward_compute_ms"], backward_comm_exposed_ms=comm - overlap)
        return out

    def _ours(self, out: dict) -> dict:
        timing = getattr(self.model, "last_timing", None)
        if timing is None or timing is self.last_seen:
            out["backward_comm_exposed_ms"] = math.nan
            return out
        self.last_seen = timing
        t = timing.as_dict()
        out.update(ddp_forward_compute_ms=t["forward_compute_time_ms"],
                   ddp_backward_compute_ms=t["backward_compute_time_ms"],
                   ddp_backward_comm_ms=t["backward_comm_time_ms"],
                   ddp_overlap_ms=t["backward_compute_comm_overlap_time_ms"],
                   backward_compute_ms=t["backward_compute_time_ms"],
                   backward_comm_exposed_ms=t["exposed_comm_time_ms"], breakdown_source="ours")
        buckets = {"launch_ms": [round(x, 4) for x in t.get("bucket_launch_ms", [])],
                   "finish_ms": [round(x, 4) for x in t.get("bucket_finish_ms", [])]}
        out["bucket_times_json"] = json.dumps(buckets, separators=(",", ":"))
        return out


def rank_metadata(ctx: RankContext) -> dict:
    """Run metadata recorded by every rank (the sweep adds git commit and time)."""
    device_name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
    return dict(rank=ctx.rank, hostname=socket.gethostname(), device_name=device_name,
                num_threads=ctx.num_threads, torch_version=torch.__version__)


def run_training_point(ctx: RankContext, cfg: TrainConfig) -> list[dict]:
    """Build, wrap and train ``cfg.model`` for warmup + iters iterations; one row per measured iteration."""
    inject_fault(cfg.fault, ctx.rank)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP broadcasts them anyway)
    model = build_model(cfg.model).to(ctx.device)
    num_params = sum(p.numel() for p in model.parameters())
    spec = input_spec(cfg.model, cfg.profile, cfg.batch_size)
    inputs = make_inputs(cfg.model, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
    model = wrap_model(model, cfg, ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    breakdown = _Breakdown(cfg.impl, model)
    meta = dict(rank_metadata(ctx), num_params=num_params, batch_size_used=spec.batch_size,
                image_size=spec.image_size, seq_len=spec.seq_len)
    rows = []
    for it in range(cfg.warmup + cfg.iters):
        synced = (it + 1) % cfg.sync_every == 0
        skip_sync = cfg.impl != "local" and not synced
        ctx.synchronize()
        t0 = time.perf_counter()
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            loss = compute_loss(cfg.model, model, inputs)
            ctx.synchronize()
            t1 = time.perf_counter()
            loss.backward()
            ctx.synchronize()
            t2 = time.perf_counter()
        if synced:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        ctx.synchronize()
        t3 = time.perf_counter()
        backward_ms = (t2 - t1) * 1e3
        split = breakdown.read(synced, backward_ms)
        if it < cfg.warmup:
            continue
        rows.append(dict(
            meta, iteration=it - cfg.warmup, synced=synced, loss=float(loss.detach()),
            forward_ms=(t1 - t0) * 1e3, backward_ms=backward_ms, optimizer_ms=(t3 - t2) * 1e3,
            total_ms=(t3 - t0) * 1e3, **split,
        ))
    return rows
