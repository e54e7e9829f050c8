"""DDP's host work per gradient and per bucket on this machine, measured by the probe on the point's own ranks.

Why apart from the link: where compute is short (many small parameters, or a fast device), what DDP's hooks and
bucket launches cost on backward's thread sets the iteration, and it is no property of the wire. So each rank times
a host-bound stand-in (``HOST_LAYERS`` ``Linear(HOST_WIDTH, HOST_WIDTH)``, compute negligible) without DDP (each
gradient stamped by a hook, as the probe's compute profile is) and with
the point's DDP at two bucket layouts (one bucket; one per gradient) over a process group of its own rank alone, so
that no byte crosses the link and nothing waits for the other ranks: the difference is host work. With ``n``
gradients and the copies priced at the probe's copy rate, one bucket costs ``n·g + b`` over no DDP and one bucket
per gradient ``n·g + n·b``, which gives ``g`` (per gradient) and ``b`` (per bucket). Each round's three backwards
are the slowest rank's (:func:`slowest`), as the probe's compute is: a DDP iteration waits for the slower rank.
"""
from __future__ import annotations

import dataclasses
import statistics

import torch
import torch.distributed as dist
from torch import nn

from ddp_impl.reducer import hook_accumulators
from harness.runner import build_trainer
from harness.timing import ms, now, stamp

HOST_LAYERS, HOST_WIDTH, HOST_BATCH = 200, 8, 2  # 400 gradients of 8 or 64 elements
# rounds of (no DDP, one bucket, one bucket per gradient), after warm-up rounds: on 2 shared cores, where g is 5-10%
# of the stand-in's backward, 8 rounds read 2-8 us a gradient across probes, 24 rounds 3-6 us (about 3 s)
HOST_ROUNDS, HOST_WARMUP = 24, 2
ONE_BUCKET_MB = 1024.0  # far above the stand-in's bytes


@dataclasses.dataclass(frozen=True)
class HostCost:
    """One rank's DDP host work on backward's thread (ms), and the backward medians it came from."""

    per_gradient_ms: float
    per_bucket_ms: float
    backward_ms: tuple[float, float, float]  # no DDP, one bucket, one bucket per gradient


def solve(backward_ms: tuple[float, float, float], gradients: int, copy_ms: float) -> HostCost:
    """``g`` and ``b`` from the three backwards (``copy_ms``: the copies the simulator already prices); never
    negative, as noise between the medians can make a difference."""
    none, one, each = backward_ms
    per_bucket = max((each - one) / (gradients - 1), 0.0)
    per_gradient = max((one - none - per_bucket - copy_ms) / gradients, 0.0)
    return HostCost(per_gradient, per_bucket, backward_ms)


def _stand_in() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(HOST_WIDTH, HOST_WIDTH) for _ in range(HOST_LAYERS)))
    x = torch.randn(HOST_BATCH, HOST_WIDTH, generator=gen)
    y = torch.randint(0, HOST_WIDTH, (HOST_BATCH,), generator=gen)
    return model, x, y


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
    return solve(medians, ranks[0]["gradients"], ranks[0]["copy_ms"])


def measure(ctx, cfg, copy_ms_per_byte: float) -> dict:
    """This rank's stand-in backwards (ms, per variant and round) under ``cfg``'s DDP (its impl and options; the
    caps are the probe's), the ranks timing at once as they train (they share the cores), for :func:`slowest`."""
    model, x, y = _stand_in()
    x, y = x.to(ctx.device), y.to(ctx.device)
    alone = dataclasses.replace(ctx, group=_own_group(ctx))
    # without DDP, each gradient stamped by a hook as the probe's compute profile is: DDP's work is what it adds
    stamps = [0.0] * len(list(model.parameters()))
    held, _ = hook_accumulators(list(model.parameters()), lambda i: lambda *_: stamps.__setitem__(i, now()))
    variants = [model.to(ctx.device)] + [
        build_trainer(_stand_in()[0].to(ctx.device), dataclasses.replace(cfg, bucket_cap_mb=mb), alone).model
        for mb in (ONE_BUCKET_MB, 0.0)]
    times: list[list[float]] = [[] for _ in variants]
    for rnd in range(HOST_WARMUP + HOST_ROUNDS):
        for k, net in enumerate(variants):
            dist.barrier(group=ctx.group)
            loss = nn.functional.cross_entropy(net(x), y)
            t0 = stamp(ctx)
            loss.backward()
            t1 = stamp(ctx)
            if rnd >= HOST_WARMUP:
                times[k].append(ms(t0, t1))
    params = list(model.parameters())
    del held
    return dict(backward_ms=times, gradients=len(params),
                copy_ms=sum(p.numel() * p.element_size() for p in params) * copy_ms_per_byte)
