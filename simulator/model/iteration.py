"""One DDP iteration as an event simulation, from compute-only timings and a communication model.

Backward produces gradients at the profile's ``ready_ms`` (slowed by ``contention`` while an allreduce moves
bytes, as compute and communication share the host's cores; while calls only wait out their latency, by the
``latency_contention`` share of it: none where latency is waiting, as on a GPU, most where it is the CPU work of
ranks that saturate the cores). A bucket
is ready with its last gradient and launches in index order (DDP's rule: every rank must issue the same
allreduces in the same order); bucket b goes to process group b % groups (round-robin process groups), whose
calls run in launch order, up to ``concurrent`` at a time (Gloo's process group runs 2 worker threads, so two
calls overlap; NCCL's one stream runs one). A call first spends its latency (the ``alpha`` terms, the cost at
0 bytes), which holds no bandwidth, then moves its bytes; calls moving bytes at the same time share the link
equally (processor sharing), so parallel calls hide latency but not bandwidth.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, replace

import torch

from ddp_impl.buckets import Bucket, ParamSpec, assign_buckets, mb_to_bytes

from .comm import CommModel

EPS = 1e-9  # ms: events closer than this are simultaneous


@dataclass(frozen=True)
class ComputeProfile:
    """Compute-only times (ms) of one rank's iteration, measured where we can run it.

    ``ready_ms[i]``: when parameter i's gradient is ready, from the start of backward, with no communication
    running; ``other_ms``: per-iteration time outside the named phases; ``contention``: while any allreduce moves
    bytes, backward compute runs at rate 1/(1+contention) (on CPU, e.g. backward 190 -> 246 ms with overlap);
    ``comm_contention``: the other way round, the allreduce's bytes while backward computes (both share cores);
    ``latency_contention``: the share of ``contention`` compute suffers while calls are in their latency only (on 2
    cores shared by 2 ranks, each bucket's small call beyond one slowed backward's compute by 0.7-1.2 ms).
    """

    param_bytes: tuple[int, ...]
    ready_ms: tuple[float, ...]
    backward_ms: float
    forward_ms: float
    optimizer_ms: float
    other_ms: float = 0.0
    contention: float = 0.0
    comm_contention: float = 0.0  # while backward computes, allreduce bytes move at rate 1/(1+comm_contention)
    latency_contention: float = 0.0  # in [0, 1]

    def __post_init__(self):
        object.__setattr__(self, "param_bytes", tuple(int(b) for b in self.param_bytes))
        object.__setattr__(self, "ready_ms", tuple(float(r) for r in self.ready_ms))
        if len(self.param_bytes) != len(self.ready_ms):
            raise ValueError(f"{len(self.param_bytes)} parameter sizes but {len(self.ready_ms)} ready times")
        times = (
            *self.ready_ms,
            self.backward_ms,
            self.forward_ms,
            self.optimizer_ms,
            self.other_ms,
            self.contention,
            self.comm_contention,
            self.latency_contention,
        )
        if min(self.param_bytes, default=0) < 0 or any(not (math.isfinite(t) and t >= 0) for t in times):
            raise ValueError("sizes, times and contention must be finite and >= 0")
        if self.latency_contention > 1:
            raise ValueError(f"latency_contention is a share, got {self.latency_contention}")
        if max(self.ready_ms, default=0.0) > self.backward_ms:
            raise ValueError(f"a gradient is ready after backward ends ({max(self.ready_ms)} > {self.backward_ms})")

    def scaled(self, compute_factor: float) -> "ComputeProfile":
        """Every compute time times ``compute_factor`` (a named cluster's device vs the one profiled)."""
        if not compute_factor > 0:
            raise ValueError(f"compute_factor must be > 0, got {compute_factor}")
        f = compute_factor
        return replace(
            self,
            ready_ms=tuple(r * f for r in self.ready_ms),
            backward_ms=self.backward_ms * f,
            forward_ms=self.forward_ms * f,
            optimizer_ms=self.optimizer_ms * f,
            other_ms=self.other_ms * f,
        )


def buckets_for(profile: ComputeProfile, cap_mb: float, first_cap_mb: float | None = None) -> list[Bucket]:
    """ddp_impl's buckets in the order gradients became ready (ties: last registered first), as DDP rebuilds
    them after the first iteration. Parameters are float32 on cpu; a size not divisible by 4 rounds up."""
    cpu = torch.device("cpu")
    specs = [ParamSpec(f"p{i}", -(-b // 4), torch.float32, cpu) for i, b in enumerate(profile.param_bytes)]
    order = sorted(range(len(specs)), key=lambda i: (profile.ready_ms[i], -i))
    first = None if first_cap_mb is None else mb_to_bytes(first_cap_mb)
    return assign_buckets(specs, mb_to_bytes(cap_mb), first, order=order)


@dataclass(frozen=True)
class Prediction:
    """``total_ms`` is the mean over ``sync_every`` iterations; the phases describe the synchronized one, with
    ``backward_ms`` as the runner times it (compute slowed by contention, then waiting for the last allreduce).
    Per-bucket times are from the start of backward; ``start_ms`` is when a call began running on its channel.
    ``comm_ms`` is the communication span as the runner measures it (``ddp_backward_comm_ms``): first bucket
    launched until the last allreduce finished; not a sum over calls, which counts concurrent ones twice."""

    total_ms: float
    forward_ms: float
    backward_ms: float
    compute_end_ms: float  # backward's compute, slowed by the calls running beside it
    comm_ms: float
    exposed_comm_ms: float
    optimizer_ms: float
    synced_ms: float
    local_ms: float
    ready_ms: tuple[float, ...]
    launch_ms: tuple[float, ...]
    start_ms: tuple[float, ...]
    done_ms: tuple[float, ...]

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _backward(
    p: ComputeProfile, buckets, comm: CommModel, world_size: int, overlap: bool, groups: int, concurrent: int = 1
):
    """Event loop over one synchronized backward: per-bucket ready/launch/start/done times and compute end."""
    n = len(buckets)
    needs = [max((p.ready_ms[i] for i in b.param_indices), default=0.0) for b in buckets]
    latency = comm.allreduce_ms(0, world_size)
    work = [max(0.0, comm.allreduce_ms(b.nbytes, world_size) - latency) for b in buckets]
    ready, launch, start, done = ([None] * n for _ in range(4))
    queues = [deque() for _ in range(groups)]
    running: dict[tuple[int, int], list] = {}  # (group, slot) -> [bucket, latency left, work left at full rate]
    t = progress = 0.0
    compute_end, launched = None, 0
    while True:
        if compute_end is None and progress >= p.backward_ms - EPS:
            compute_end = t
        for b in range(n):
            if ready[b] is None and progress >= needs[b] - EPS:
                ready[b] = t
        while launched < n and (ready[launched] is not None if overlap else compute_end is not None):
            launch[launched] = t
            queues[launched % groups].append(launched)
            launched += 1
        _finish_calls(running, done, t)
        _start_calls(queues, running, start, t, concurrent, latency, work)
        if compute_end is not None and not running:
            return ready, launch, start, done, compute_end
        sharing = sum(1 for job in running.values() if job[1] <= 0)  # calls moving bytes
        busy = 1.0 if sharing else p.latency_contention if running else 0.0  # calls in their latency only
        rate = 1.0 / (1.0 + p.contention * busy)
        slow = 1.0 + p.comm_contention if compute_end is None else 1.0  # bytes move slower while compute runs
        steps = [job[1] if job[1] > 0 else job[2] * sharing * slow for job in running.values()]
        if compute_end is None:
            target = min([needs[b] for b in range(n) if ready[b] is None] + [p.backward_ms])
            steps.append((target - progress) / rate)
        dt = max(min(steps), 0.0)
        t += dt
        if compute_end is None:
            progress += dt * rate
        _advance_calls(running, dt, sharing, slow)


def _finish_calls(running: dict, done: list, t: float) -> None:
    """Calls past their latency with no bytes left end at ``t``, freeing their slots."""
    for slot, job in list(running.items()):
        if job[1] <= 0 and job[2] <= EPS:
            done[job[0]] = t
            del running[slot]


def _start_calls(queues, running: dict, start: list, t: float, concurrent: int, latency: float, work: list) -> None:
    """Each group's queued calls take its free slots, in launch order, at ``t``."""
    for g, queue in enumerate(queues):
        for k in range(concurrent):
            if (g, k) not in running and queue:
                b = queue.popleft()
                start[b] = t
                running[(g, k)] = [b, latency, work[b]]


def _advance_calls(running: dict, dt: float, sharing: int, slow: float) -> None:
    """``dt`` ms of progress on the running calls: latency first, then bytes, sharing the link equally."""
    for job in running.values():
        if job[1] > 0:
            job[1] = 0.0 if job[1] - dt <= EPS else job[1] - dt
        else:
            job[2] -= dt / sharing / slow


def simulate(
    profile: ComputeProfile,
    buckets: list[Bucket],
    comm: CommModel,
    world_size: int,
    *,
    overlap: bool = True,
    groups: int = 1,
    sync_every: int = 1,
    concurrent: int = 1,
) -> Prediction:
    """Predict an iteration: ``overlap=False`` launches every bucket when backward ends; ``groups`` round-robin
    process groups, each running up to ``concurrent`` calls at once; ``sync_every = n`` averages n-1 local
    iterations (no communication, no optimizer step, as the runner accumulates gradients) with one synchronized
    iteration."""
    if world_size < 1 or groups < 1 or sync_every < 1 or concurrent < 1:
        raise ValueError(
            f"need world_size, groups, sync_every, concurrent >= 1, got {world_size}, {groups}, "
            f"{sync_every}, {concurrent}"
        )
    ready, launch, start, done, compute_end = _backward(profile, buckets, comm, world_size, overlap, groups, concurrent)
    backward = max([compute_end, *done])
    p = profile
    synced = p.forward_ms + backward + p.optimizer_ms + p.other_ms
    local = p.forward_ms + p.backward_ms + p.other_ms
    return Prediction(
        total_ms=(synced + (sync_every - 1) * local) / sync_every,
        forward_ms=p.forward_ms,
        backward_ms=backward,
        compute_end_ms=compute_end,
        comm_ms=max(done) - min(launch) if launch else 0.0,
        exposed_comm_ms=backward - p.backward_ms,
        optimizer_ms=p.optimizer_ms,
        synced_ms=synced,
        local_ms=local,
        ready_ms=tuple(ready),
        launch_ms=tuple(launch),
        start_ms=tuple(start),
        done_ms=tuple(done),
    )
