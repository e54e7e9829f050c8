"""Allreduce microbenchmark (paper Figure 2): is one big allreduce faster than many small ones?

A flat float32 buffer of ``total_params`` is split into ``ceil(total / k)`` contiguous chunks of
``k = params_per_call`` elements, and the chunks are allreduced one after another with blocking calls
(as a non-bucketed DDP would). One measured iteration = all chunks, between a barrier and a device sync.

algbw = total bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests' allreduce convention, n = world size),
both in GB/s (1e9 bytes/s). The buffer holds zeros so values never overflow, however many iterations run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.config import AllreduceConfig
from harness.launch.faults import inject_fault
from harness.launch.spawn import RankContext
from harness.workloads.phases import ms, stamp
from harness.workloads.runner import rank_metadata

BYTES_PER_PARAM = 4  # float32


def bus_factor(world_size: int) -> float:
    """busbw / algbw for allreduce: 2(n-1)/n (0 for one rank, which moves nothing)."""
    return 2 * (world_size - 1) / world_size


def run_allreduce_point(ctx: RankContext, cfg: AllreduceConfig) -> list[dict]:
    """Time ``cfg.iters`` rounds (after ``cfg.warmup``) of allreducing the buffer in chunks; one row each."""
    inject_fault(cfg.fault, ctx.rank)
    buffer = torch.zeros(cfg.total_params, dtype=torch.float32, device=ctx.device)
    chunks = buffer.split(cfg.params_per_call)
    total_bytes = cfg.total_params * BYTES_PER_PARAM
    meta = rank_metadata(ctx)
    rows = []
    for it in range(cfg.warmup + cfg.iters):
        dist.barrier(group=ctx.group)
        t0 = stamp(ctx)
        for chunk in chunks:
            dist.all_reduce(chunk, group=ctx.group)
        total_ms = ms(t0, stamp(ctx))
        if it < cfg.warmup:
            continue
        algbw = total_bytes / (total_ms / 1e3) / 1e9
        rows.append(
            dict(
                meta,
                iteration=it - cfg.warmup,
                num_calls=len(chunks),
                total_bytes=total_bytes,
                total_ms=total_ms,
                call_ms=total_ms / len(chunks),
                algbw_gbps=algbw,
                busbw_gbps=algbw * bus_factor(ctx.world_size),
            )
        )
    return rows


def call_samples(rows) -> list[tuple[int, float, float]]:
    """This microbenchmark's rows (a frame of one backend) as ``(world_size, bytes per call, ms per call)``, the
    median per (world size, total, call size) over ranks and iterations: what a ring alpha-beta fit takes. The
    last call of a split is shorter (10M-parameter calls of 25.6M: 10, 10, 5.6M), and a call's cost is affine in its
    size, so the mean call costs the mean."""
    calls = (
        rows[rows["world_size"] > 1]
        .groupby(["world_size", "total_params", "params_per_call"])[["call_ms", "total_bytes", "num_calls"]]
        .median()
    )
    return [(int(n), float(row.total_bytes / row.num_calls), float(row.call_ms)) for (n, _, _), row in calls.iterrows()]
