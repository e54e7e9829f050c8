"""DDP's host work per gradient and per bucket on this machine, measured by the probe on the point's own ranks.

Each rank times a host-bound stand-in (:class:`StandIn`: the point's model's parameters, as many and as large,
without its compute) without DDP (each gradient stamped by a hook, as the probe's compute profile is) and with the
point's DDP at two bucket layouts (one bucket; about ``GRADIENTS_PER_BUCKET`` gradients a bucket) over a process group
of its own rank alone, so that no byte crosses the link and nothing waits for the other ranks: the difference is host
work, which :func:`simulator.model.host_cost.solve` turns into a cost per gradient and per bucket, the copies into the
buckets and back out priced at the probe's copy rate. Each round's three backwards are the slowest rank's
(:func:`slowest`), as the probe's compute is: a DDP iteration waits for the slower rank.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch
import torch.distributed as dist
from torch import nn

from ddp_impl.bucket_store import EAGER_COPY_NUMEL
from ddp_impl.buckets import ParamSpec, assign_buckets
from ddp_impl.options import MIB
from ddp_impl.reducer import hook_accumulators
from harness.workloads.phases import ms, now, stamp
from harness.workloads.runner import build_trainer

from ..model.host_cost import HostCost, solve

# What a gradient costs DDP depends on how many there are and how large they are, so the stand-in takes the point's
# model's parameters (2 ranks, 2 cores, one bucket; a stand-in of 400 Linear(8, 8) gradients read 1.2-1.4 us each,
# of 800 1.7-1.9, of 1600 2.3; on one rank 400 Linear(w, w) layers cost 3.8 / 4.1 / 8.9 us a gradient at w = 8 / 16 /
# 64, their parameters alone 4.1 / 4.4 / 8.2). Each is at most this large: from there on DDP copies a gradient by
# its own hook at the rate the probe's copy measures.
STAND_IN_MAX_NUMEL = EAGER_COPY_NUMEL
# The second layout's buckets hold about this many gradients, as DDP's do, rather than one each: a bucket of one
# gradient costs less than one of several (one rank, 800 gradients, 1 thread: 74 us a bucket from 134 to 800 buckets,
# 100 from 9 to 80; tiny-layers' own buckets 80 and 102), so one bucket per gradient priced DDP's buckets 25% low.
GRADIENTS_PER_BUCKET = 10
# ... but at least this many buckets (or one per gradient, where there are fewer gradients): the cost per bucket is a
# difference of two medians over all but one of them, and 16 buckets (ResNet50's 161 gradients, 10 a bucket) left it
# to noise on 3 ranks sharing 2 cores (113-487 us, 90% of bootstrapped rounds; 161 buckets 136-162)
MIN_BUCKETS = 100
# rounds of (no DDP, one bucket, the second layout), after warm-up rounds: on 2 shared cores, where g is 5-10%
# of the stand-in's backward, 8 rounds read 2-8 us a gradient across probes, 24 rounds 3-6 us (about 3 s)
HOST_ROUNDS, HOST_WARMUP = 24, 2


class StandIn(nn.Module):
    """Flat parameters as large as ``params`` (each at most ``STAND_IN_MAX_NUMEL``), of their dtypes, and a forward
    that only scales and sums each: its backward yields one gradient per parameter, in reverse order, for next to no
    compute."""

    def __init__(self, params: list[torch.Tensor], device):
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(torch.zeros(min(p.numel(), STAND_IN_MAX_NUMEL), dtype=p.dtype, device=device)) for p in params
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for w in self.weights:
            out = out + (w * x).sum()
        return out


def _own_group(ctx):
    """A process group of this rank alone (every rank creates every rank's, in order, as torch requires)."""
    groups = [dist.new_group([r]) for r in range(ctx.world_size)]
    return groups[ctx.rank]


def slowest(ranks: list[dict]) -> HostCost:
    """The :class:`HostCost` of every rank's :func:`measure`: per round, each variant's slowest rank, then medians
    (the slowest rank's own estimate, a small difference of two noisy medians, read up to 16 us a gradient where
    the per-round slowest read 3-8)."""
    rounds = [tuple(map(max, zip(*variant))) for variant in zip(*(r["backward_ms"] for r in ranks))]
    medians = tuple(float(statistics.median(v)) for v in rounds)
    return solve(medians, ranks[0]["gradients"], ranks[0]["copy_ms"], ranks[0].get("buckets"))


def measure(ctx, cfg, copy_ms_per_byte: float, params: list[torch.Tensor]) -> dict:
    """This rank's stand-in backwards (ms, per variant and round) under ``cfg``'s DDP (its impl and options; the
    caps are the probe's), the ranks timing at once as they train (they share the cores), for :func:`slowest`;
    ``params``: the point's model's trainable parameters, whose sizes the stand-in takes."""
    model, x = StandIn(params, ctx.device), torch.ones((), device=ctx.device)
    weights = list(model.parameters())
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    caps = layouts(weights)
    alone = dataclasses.replace(ctx, group=_own_group(ctx))
    # without DDP, each gradient stamped by a hook as the probe's compute profile is: DDP's work is what it adds
    stamps = [0.0] * len(weights)
    held, _ = hook_accumulators(weights, lambda i: lambda *_: stamps.__setitem__(i, now()))
    variants = [model] + [
        build_trainer(StandIn(params, ctx.device), dataclasses.replace(cfg, bucket_cap_mb=mb), alone).model
        for mb, _ in caps
    ]
    times: list[list[float]] = [[] for _ in variants]
    for rnd in range(HOST_WARMUP + HOST_ROUNDS):
        for k, net in enumerate(variants):
            dist.barrier(group=ctx.group)
            loss = net(x)
            t0 = stamp(ctx)
            loss.backward()
            t1 = stamp(ctx)
            if rnd >= HOST_WARMUP:
                times[k].append(ms(t0, t1))
    del held
    return dict(
        backward_ms=times,
        gradients=len(weights),
        buckets=[count for _, count in caps],
        copy_ms=2 * nbytes * copy_ms_per_byte,
    )  # into the buckets and back out


def layouts(weights: list[torch.Tensor]) -> list[tuple[float, int]]:
    """The two layouts' caps (MiB) and bucket counts: one bucket (one per dtype), and buckets of equal bytes,
    about ``GRADIENTS_PER_BUCKET`` gradients each but at least ``MIN_BUCKETS`` of them (one per gradient where that
    leaves no fewer), counted as DDP lays them out from its second iteration (gradients in reverse registration
    order, as the stand-in's arrive)."""
    specs = [ParamSpec.of(str(i), w) for i, w in enumerate(weights)]
    nbytes = sum(s.nbytes for s in specs)

    def count(cap_bytes: int) -> int:
        return len(assign_buckets(specs, cap_bytes))

    want = max(len(specs) // GRADIENTS_PER_BUCKET, MIN_BUCKETS)
    several = nbytes // want if want < len(specs) else 0
    if several and count(several) < want:  # large gradients each fill a bucket: the largest cap that gives enough
        lo, hi = 0, several
        while hi - lo > 1:
            lo, hi = ((lo + hi) // 2, hi) if count((lo + hi) // 2) >= want else (lo, (lo + hi) // 2)
        several = lo
    return [(2 * nbytes / MIB, count(2 * nbytes)), (several / MIB, count(several))]
