"""``make bench``'s jobs on each rank: the interleaved latency rounds and the peak-memory runs."""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

from ddp_impl import MIB, DDPOptions
from experiments.tools.bench_config import BenchConfig
from harness.launch.spawn import RankContext
from harness.workloads.memory import PeakMeter, current_bytes
from harness.workloads.models import input_spec, make_inputs, seeded_model
from harness.workloads.phases import ms, stamp
from harness.workloads.runner import round_order, timed_iteration
from harness.workloads.systems import wrap

ORDER = ("torch", "ours", "ours_notiming", "torch_b", "local", "allreduce")


def _fresh(name: str, ctx: RankContext, seed: int):
    return seeded_model(name, seed).to(ctx.device)  # built once per rank, copied for each variant


def _iteration(name, model, opt, inputs, ctx: RankContext) -> dict:
    """One timed iteration after a barrier: both ranks start together, so a round's latency is the slower's."""
    dist.barrier(group=ctx.group)
    return timed_iteration(name, model, opt, inputs, ctx)[0]


def _allreduce_all(buffers, ctx: RankContext) -> dict:
    dist.barrier(group=ctx.group)
    t0, c0 = stamp(ctx), time.process_time()
    works = [dist.all_reduce(b, group=ctx.group, async_op=True) for b in buffers]
    for w in works:
        w.wait()
    return dict(total_ms=ms(t0, stamp(ctx)), cpu_ms=(time.process_time() - c0) * 1e3)


def latency_job(ctx: RankContext, name: str, cap_mb: float, cfg: BenchConfig) -> dict:
    """One (model, cap) point on one rank: warmup + measured rounds of every variant, interleaved."""
    spec = input_spec(name, cfg.profile)
    inputs = make_inputs(name, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
    torch_ddp = wrap(_fresh(name, ctx, cfg.seed), "torch", ctx, DDPOptions(cap_mb))
    ours = wrap(_fresh(name, ctx, cfg.seed), "ours", ctx, DDPOptions(cap_mb))
    torch_b_ddp = wrap(_fresh(name, ctx, cfg.seed), "torch", ctx, DDPOptions(cap_mb))
    local = _fresh(name, ctx, cfg.seed)
    opts = {m: torch.optim.SGD(m.parameters(), lr=cfg.lr) for m in (torch_ddp, ours, torch_b_ddp, local)}
    models = {"torch": torch_ddp, "ours": ours, "ours_notiming": ours, "torch_b": torch_b_ddp, "local": local}
    buffers: list[torch.Tensor] = []
    samples = []
    for rnd in range(cfg.warmup + cfg.iters):
        if rnd == cfg.warmup:  # buckets are final now: the allreduce reference uses their sizes
            buffers = [torch.zeros(b.numel, dtype=b.dtype, device=b.device) for b in ours.reducer.buckets]
        for variant in round_order(ORDER, rnd, cfg.seed):
            if variant == "allreduce":
                if buffers:
                    samples.append(dict(variant=variant, round=rnd - cfg.warmup, **_allreduce_all(buffers, ctx)))
                continue
            ours.timing = variant != "ours_notiming"
            model = models[variant]
            row = _iteration(name, model, opts[model], inputs, ctx)
            if rnd >= cfg.warmup:
                samples.append(dict(variant=variant, round=rnd - cfg.warmup, **row))
    logged = torch_ddp._get_ddp_logging_data()  # torch logs its rebuilt bucket sizes (bytes) once it rebuilt
    torch_sizes = str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or "")
    return dict(
        samples=samples,
        rank=ctx.rank,
        num_threads=ctx.num_threads,
        ours_bucket_bytes=" ".join(str(b.nbytes) for b in ours.reducer.buckets),
        torch_bucket_bytes=" ".join(x.strip() for x in torch_sizes.split(",")),
        num_params=sum(p.numel() for p in local.parameters()),
    )


def memory_job(ctx: RankContext, name: str, cap_mb: float, variant: str, as_view: bool, cfg: BenchConfig) -> dict:
    """Peak memory of one variant above what model + inputs hold: while wrapping and through the bucket
    rebuild (first 2 iterations), and in steady state (the next ``memory_iters``)."""
    spec = input_spec(name, cfg.profile)
    inputs = make_inputs(name, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
    model = _fresh(name, ctx, cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    _iteration(name, model, opt, inputs, ctx)  # runtime start-up (thread pools, workspaces) is not DDP's
    model.zero_grad(set_to_none=True)
    del opt
    gc.collect()
    ctx.synchronize()
    before = current_bytes(ctx.device)
    with PeakMeter(ctx.device, before) as startup:
        wrapped = wrap(model, variant, ctx, DDPOptions(cap_mb, gradient_as_bucket_view=as_view))
        opt = torch.optim.SGD(wrapped.parameters(), lr=cfg.lr)
        for _ in range(2):
            _iteration(name, wrapped, opt, inputs, ctx)
    with PeakMeter(ctx.device, before) as steady:
        for _ in range(cfg.memory_iters):
            _iteration(name, wrapped, opt, inputs, ctx)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return dict(
        rank=ctx.rank, startup_peak_mb=startup.peak / MIB, peak_mb=steady.peak / MIB, param_mb=param_bytes / MIB
    )
