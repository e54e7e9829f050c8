"""Time training iterations on one rank: ours, torch's DDP, or no DDP, all by the same loop.

Every iteration (:func:`timed_iteration`; ``make bench`` times its variants with it too) is bracketed by host
clocks (with ``torch.cuda.synchronize`` on GPU): forward (incl. loss), backward, optimizer step (incl.
zero_grad), plus the rank's CPU time and page faults from ``getrusage``. The split of backward into compute
and exposed communication comes from the DDP implementation's own instrumentation:

* ``ours``: ``ddp.last_timing.as_dict()`` (plus per-bucket launch/finish timestamps).
* ``torch``: torch's DDP logger. With ``_set_ddp_runtime_logging_sample_rate(1)`` torch samples every
  synchronized iteration, but only stores an iteration's stats at the *next* synchronized forward. Checked
  empirically with torch 2.14: calling ``ddp.logger.set_runtime_stats_and_log()`` right after backward stores
  the current iteration, and ``_get_ddp_logging_data()["iteration"]`` advances by one per synchronized
  iteration. The runner calls it after the iteration's clocks stop, and if ``iteration`` did not advance
  (a torch without that behaviour) it falls back to host timers: backward_compute_ms = whole backward,
  exposed comm unknown (NaN); ``breakdown_source`` says which was used.
* ``zero1``, ``fsdp*``, ``deepspeed*``: communication happens inside their own backward and is not separated:
  backward_compute_ms and exposed comm are NaN (``host``).
* ``local``, ``threads`` and iterations inside ``no_sync()``: no communication, so backward compute = host backward and
  exposed comm = 0 (``breakdown_source = host``).

With ``sync_every = n``, iteration ``i`` (counted from the first warmup iteration) synchronizes when
``(i + 1) % n == 0``; the optimizer steps only on synchronized iterations (gradient accumulation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import resource
import socket
from pathlib import Path
from typing import Sequence

import torch

from ddp_impl.autotune import AUTO
from harness.config import TrainConfig
from harness.launch.allocator import trim_heap
from harness.launch.faults import inject_fault
from harness.launch.spawn import RankContext
from harness.workloads import autotune_point, memory
from harness.workloads.breakdown import Breakdown
from harness.workloads.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.workloads.phases import ms, stamp
from harness.workloads.systems import Trainer, build, state_tensors


def build_trainer(model: torch.nn.Module, cfg: TrainConfig, ctx: RankContext) -> Trainer:
    """:func:`harness.workloads.systems.build` as ``cfg`` says, with torch's DDP logging every iteration: the runner
    reads its backward breakdown from that logger. Only here: sampling every iteration costs torch's DDP time the
    bench would count against it."""
    trainer = build(
        model,
        ctx,
        impl=cfg.impl,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        checkpointing=cfg.checkpointing,
        replicas=cfg.replicas,
        ddp=cfg.ddp_options(),
        round_robin_groups=cfg.round_robin_groups,
    )
    if cfg.impl == "torch":
        trainer.model._set_ddp_runtime_logging_sample_rate(1)
    return trainer


def timed_iteration(
    model_name: str,
    model,
    optimizer,
    inputs,
    ctx: RankContext,
    *,
    no_sync: bool = False,
    step: bool = True,
    backward=torch.Tensor.backward,
) -> tuple[dict, torch.Tensor]:
    """One training iteration timed by phase: forward (incl. loss), backward, optimizer (step + zero_grad),
    each boundary a :func:`harness.workloads.phases.stamp`. ``no_sync``: forward and backward inside
    ``model.no_sync()``;
    ``step=False``: no optimizer step (gradient accumulation); ``backward(loss)`` runs backward (DeepSpeed's
    engine has its own). Returns the times (ms) with the rank's CPU time
    over all its threads (compute + communication; unlike wall time it barely moves when other processes
    share the cores), its kernel part and the minor page faults, and the loss."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = stamp(ctx)
    with model.no_sync() if no_sync else contextlib.nullcontext():
        loss = compute_loss(model_name, model, inputs)
        t1 = stamp(ctx)
        backward(loss)
        t2 = stamp(ctx)
    if step:
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    t3 = stamp(ctx)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return dict(
        forward_ms=ms(t0, t1),
        backward_ms=ms(t1, t2),
        optimizer_ms=ms(t2, t3),
        total_ms=ms(t0, t3),
        cpu_ms=(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3,
        sys_ms=(r1.ru_stime - r0.ru_stime) * 1e3,
        minor_faults=r1.ru_minflt - r0.ru_minflt,
    ), loss


def machine_metadata() -> dict:
    """The machine a measurement ran on: host, CPU model, cores, first GPU ('' without), torch version. The
    bench records all of it (plus ``results.git_commit``); every row its host and torch (:func:`rank_metadata`)."""
    cpuinfo = Path("/proc/cpuinfo")
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            "",
        )
        if cpuinfo.exists()
        else ""
    )
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return dict(hostname=socket.gethostname(), cpu=cpu, cores=os.cpu_count(), gpu=gpu, torch_version=torch.__version__)


def rank_metadata(ctx: RankContext) -> dict:
    """Run metadata recorded by every rank (the sweep adds git commit and time)."""
    host = machine_metadata()
    device_name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
    return dict(
        rank=ctx.rank,
        hostname=host["hostname"],
        device_name=device_name,
        num_threads=ctx.num_threads,
        torch_version=host["torch_version"],
    )


class _PointTrainer:
    """One training point set up on this rank, ready to run its iterations: its trainer, inputs, breakdown reader
    and the metadata of its rows."""

    def __init__(self, ctx: RankContext, cfg: TrainConfig):
        self.cfg = cfg
        model = seeded_model(cfg.model, cfg.seed).to(ctx.device)  # same weights on every rank (DDP broadcasts)
        num_params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them away
        spec = input_spec(cfg.model, cfg.profile, cfg.batch_size)
        self.inputs = make_inputs(cfg.model, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
        self.trainer = build_trainer(model, cfg, ctx)
        self.breakdown = Breakdown(cfg.impl, self.trainer.model)
        self.meta = dict(
            rank_metadata(ctx),
            num_params=num_params,
            batch_size_used=spec.batch_size,
            image_size=spec.image_size,
            seq_len=spec.seq_len,
        )
        self.settled = self.settle(ctx) if cfg.bucket_cap_mb == AUTO else (0, 0.0)  # (iterations, ms)

    def iteration(self, ctx: RankContext, it: int) -> dict | None:
        """Run iteration ``it`` (counted from the first warmup iteration); its row once past the warmup."""
        cfg = self.cfg
        synced = (it + 1) % cfg.sync_every == 0
        times, loss = timed_iteration(
            cfg.model,
            self.trainer.model,
            self.trainer.optimizer,
            self.inputs,
            ctx,
            no_sync=cfg.impl != "local" and not synced,
            step=synced,
            backward=self.trainer.backward,
        )
        split = self.breakdown.read(synced, times["backward_ms"])
        if it < cfg.warmup:
            return None
        row = dict(self.meta, iteration=it - cfg.warmup, synced=synced, loss=float(loss.detach()), **times, **split)
        return (
            row
            if cfg.bucket_cap_mb != AUTO
            else dict(row, **autotune_point.columns(self.trainer.model, cfg, it, *self.settled))
        )

    def settle(self, ctx: RankContext) -> tuple[int, float]:
        """With ``bucket_cap_mb="auto"``: :func:`harness.workloads.autotune_point.settle` on this point's iterations."""
        cfg = self.cfg

        def iterate(n: int) -> None:
            synced = (n + 1) % cfg.sync_every == 0
            timed_iteration(
                cfg.model, self.trainer.model, self.trainer.optimizer, self.inputs, ctx,
                no_sync=not synced, step=synced, backward=self.trainer.backward,
            )  # fmt: skip

        return autotune_point.settle(self.trainer.model, iterate, cfg.sync_every)


def run_training_point(ctx: RankContext, cfg: TrainConfig) -> list[dict]:
    """Build, wrap and train ``cfg.model`` for warmup + iters iterations; one row per measured iteration. With
    ``cfg.memory``, every row also carries the memory and traffic columns of :func:`measure_memory`."""
    inject_fault(cfg.fault, ctx.rank)
    if cfg.memory:  # what loads once per process comes before the floor: code, the profiler, the model's cache
        memory.return_freed_memory()
        _load_code(ctx, cfg)
        memory.profiled(lambda: torch.ones(1) + 1)
        seeded_model(cfg.model, cfg.seed)
        trim_heap()  # what those left freed
    floor = memory.current_bytes(ctx.device)  # the process without this point's tensors: PeakMeter's zero
    point = _PointTrainer(ctx, cfg)
    rows = [row for it in range(cfg.warmup + cfg.iters) if (row := point.iteration(ctx, it)) is not None]
    if cfg.memory:
        extra = measure_memory(cfg, point.trainer, point.inputs, ctx, floor)
        timeline = extra.pop("mem_timeline_json")
        rows = [dict(row, **extra, mem_timeline_json=timeline if row["iteration"] == 0 else "") for row in rows]
    return rows


def _load_code(ctx: RankContext, cfg: TrainConfig) -> None:
    """Train the small model one iteration with ``cfg``'s system, so the code it loads on first use is resident
    before a memory floor rather than counted as the point's memory (measured: DeepSpeed's first engine imports
    ~1600 modules, sympy and triton among them, +127 MiB; FSDP2's first use +32 MiB; a second one +0.1 MiB)."""
    small = dataclasses.replace(cfg, model="small", batch_size=0, checkpointing=False, memory=False)
    _PointTrainer(ctx, small).iteration(ctx, 0)


def round_order(names: Sequence, rnd: int, seed: object) -> list:
    """The order of round ``rnd`` of interleaved variants: a fresh seeded shuffle per round, the same on every
    rank (their collectives must match), so no variant always runs right after the same other."""
    return random.Random(f"{seed}/{rnd}").sample(list(names), len(names))


def run_training_points(ctx: RankContext, cfgs: Sequence[TrainConfig]) -> list[list[dict]]:
    """Points that differ only in how they train (``harness.sweep_order.INTERLEAVED_FIELDS``) measured together, the
    way ``make bench`` measures its variants: every trainer is built first, then each round runs one iteration of
    every point in :func:`round_order`. The machine's speed drifts over seconds, so iteration ``i`` of two points
    forms a pair measured under the same load, which separate launches (tens of seconds apart) are not. Returns
    each point's rows, as :func:`run_training_point` would, with each row's ``round_position``."""
    points = [_PointTrainer(ctx, cfg) for cfg in cfgs]
    rows: list[list[dict]] = [[] for _ in cfgs]
    first = cfgs[0]
    for it in range(first.warmup + first.iters):
        for position, k in enumerate(round_order(range(len(cfgs)), it, (first.seed, first.repeat))):
            row = points[k].iteration(ctx, it)
            if row is not None:
                rows[k].append(dict(row, round_position=position))
    return rows


def measure_memory(cfg: TrainConfig, trainer: Trainer, inputs: dict, ctx: RankContext, floor: int) -> dict:
    """Two more iterations after the timed ones: one measuring the peak (:class:`harness.workloads.memory.PeakMeter`)
    and the payload bytes this rank sent (between barriers, so nothing else is counted), one under the memory profiler
    (categories at the peak, model state before forward, the timeline)."""
    import torch.distributed as dist

    def iteration():
        return timed_iteration(cfg.model, trainer.model, trainer.optimizer, inputs, ctx, backward=trainer.backward)

    barrier = (lambda: dist.barrier(group=ctx.group)) if ctx.world_size > 1 else (lambda: None)
    barrier()
    sent = memory.sent_bytes()
    with memory.PeakMeter(ctx.device, floor) as meter:
        iteration()
    barrier()
    sent = memory.sent_bytes() - sent
    _, prof = memory.profiled(iteration, state_tensors(trainer))
    state = {k: prof.at_start[k] for k in ("parameters", "gradients", "optimizer_state")}
    timeline = [[round(t, 3), *(s[c] for c in memory.CATEGORIES)] for t, s in prof.timeline]
    return dict(
        {f"mem_{c}_bytes": prof.at_peak[c] for c in memory.CATEGORIES},
        mem_profiled_peak_bytes=prof.peak,
        mem_measured_peak_bytes=meter.peak,
        mem_model_state_bytes=sum(state.values()),
        sent_bytes=sent,
        mem_timeline_json=json.dumps(timeline, separators=(",", ":")),
    )
