"""Predict one DDP point from a calibration: ddp_impl's buckets for the cap, DDP's own copies, the simulation.

What DDP adds to the calibrated compute: each gradient is copied into its bucket inside its hook (on the
backward's thread, so later gradients are ready that much later) and copied back out after the last allreduce;
before every forward it broadcasts the module's buffers (``broadcast_buffers=True``, torch's default and ours); and
its host work per gradient and per bucket (probed on this machine, stated for a named cluster).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ddp_impl.options import DEFAULT_BUCKET_CAP_MB

from .calibration import Calibration
from .comm import CommModel, concurrent_calls
from .iteration import ComputeProfile, Prediction, buckets_for, simulate


@dataclass(frozen=True)
class Scenario:
    """What a prediction varies on a calibrated (model, ranks, network): the point's DDP options."""

    bucket_cap_mb: float = float(DEFAULT_BUCKET_CAP_MB)
    overlap: bool = True
    round_robin_groups: int = 1
    sync_every: int = 1


def with_bucket_copies(profile: ComputeProfile, copy_ms_per_byte: float) -> ComputeProfile:
    """The profile as DDP's backward runs it: each gradient's copy into its bucket delays every later one."""
    order = sorted(range(len(profile.ready_ms)), key=lambda i: (profile.ready_ms[i], -i))
    ready = list(profile.ready_ms)
    copies = itertools.accumulate(profile.param_bytes[i] * copy_ms_per_byte for i in order)
    for i, copied in zip(order, copies):
        ready[i] += copied
    extra = sum(profile.param_bytes) * copy_ms_per_byte
    return replace(profile, ready_ms=tuple(ready), backward_ms=profile.backward_ms + extra)


def with_host_overhead(
    profile: ComputeProfile, buckets, per_gradient_ms: float, per_bucket_ms: float
) -> ComputeProfile:
    """The profile with DDP's host work on backward's thread: each gradient's hook, and each bucket's launch once its
    last gradient is in, delay that gradient and every later one, and backward's end (where the host sets the pace,
    as for BERT-base at batch 8 on an H100, this work is on the critical path)."""
    if not (per_gradient_ms or per_bucket_ms):
        return profile
    order = sorted(range(len(profile.ready_ms)), key=lambda i: (profile.ready_ms[i], -i))
    position = {i: k for k, i in enumerate(order)}
    closes = {max(b.param_indices, key=position.__getitem__) for b in buckets if b.param_indices}
    ready, delay = list(profile.ready_ms), 0.0
    for i in order:
        delay += per_gradient_ms + (per_bucket_ms if i in closes else 0.0)
        ready[i] += delay
    return replace(profile, ready_ms=tuple(ready), backward_ms=profile.backward_ms + delay)


def predict(cal: Calibration, scenario: Scenario, comm: CommModel | None = None) -> dict:
    """Predicted per-iteration latency (``predicted_ms``, the mean over ``sync_every`` iterations) and its
    breakdown, for ``scenario`` on the calibrated point (``comm`` replaces the probed link's model)."""
    comm = comm or cal.comm
    world_size = int(cal.point["world_size"])
    profile = with_bucket_copies(cal.profile, cal.copy_ms_per_byte)
    broadcast_ms = comm.allreduce_ms(cal.buffer_bytes, world_size) / 2 if cal.buffer_bytes else 0.0
    copy_out_ms = sum(profile.param_bytes) * cal.copy_ms_per_byte
    profile = replace(profile, forward_ms=profile.forward_ms + broadcast_ms)
    buckets = buckets_for(profile, scenario.bucket_cap_mb)
    before_host = profile.backward_ms
    profile = with_host_overhead(profile, buckets, cal.host_per_gradient_ms, cal.host_per_bucket_ms)
    backend = cal.point.get("process_group") or cal.point["backend"]  # a probe's concrete backend, or a cluster's
    sim: Prediction = simulate(
        profile,
        buckets,
        comm,
        world_size,
        overlap=scenario.overlap,
        groups=scenario.round_robin_groups,
        concurrent=concurrent_calls(backend),
    )
    n = scenario.sync_every
    synced = sim.synced_ms + copy_out_ms
    local = profile.forward_ms + cal.profile.backward_ms + profile.other_ms  # no_sync: no bucket copies
    return dict(
        predicted_ms=(synced + (n - 1) * local) / n,
        synced_ms=synced,
        local_ms=local,
        forward_ms=sim.forward_ms,
        backward_ms=sim.backward_ms + copy_out_ms,
        optimizer_ms=sim.optimizer_ms,
        backward_compute_ms=cal.profile.backward_ms,
        exposed_comm_ms=sim.exposed_comm_ms + copy_out_ms,
        comm_ms=sim.comm_ms,
        buffer_broadcast_ms=broadcast_ms,
        host_ms=profile.backward_ms - before_host,
        num_buckets=len(buckets),
        bucket_bytes=[b.nbytes for b in buckets],
        bucket_ready_ms=list(sim.ready_ms),
        bucket_done_ms=list(sim.done_ms),
    )
