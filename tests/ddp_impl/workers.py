"""Per-rank bodies of the ddp_impl tests, run by ``harness.launch.spawn`` (spawned ranks import this module)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp_impl import DistributedDataParallel as OurDDP
from ddp_impl import RoundRobinProcessGroup
from experiments.parity import (
    CAPS_MB,
    STEPS,
    Branchy,
    ConvNet,
    Reordered,
    compare,  # noqa: F401 (CAPS_MB)
    max_rel_error,
    mlp,
    seeded,
)


def equivalence_matrix(ctx):
    """Max relative error vs torch's DDP for every configuration the issue lists, computed in one spawn."""
    rank = ctx.rank
    errors = {}
    for cap in CAPS_MB:
        for overlap in (True, False):
            errors[f"convnet cap={cap} overlap={overlap}"] = compare(
                rank, dict(bucket_cap_mb=cap, overlap=overlap), {}, "convnet"
            )
    errors["convnet gradient_as_bucket_view"] = compare(
        rank, dict(bucket_cap_mb=0.01, gradient_as_bucket_view=True), dict(gradient_as_bucket_view=True), "convnet"
    )
    errors["convnet channels_last cap=0"] = compare(rank, dict(bucket_cap_mb=0), {}, "convnet_channels_last")
    errors["no_sync accum=2 cap=0"] = compare(rank, dict(bucket_cap_mb=0), {}, "convnet", 2)
    for accum in (1, 2, 3, 4):
        errors[f"no_sync accum={accum}"] = compare(rank, dict(bucket_cap_mb=0.01), {}, "convnet", accum)
        errors[f"no_sync accum={accum} view"] = compare(
            rank, dict(bucket_cap_mb=0.01, gradient_as_bucket_view=True), {}, "convnet", accum
        )
    for cap in (0, 25):
        errors[f"find_unused cap={cap}"] = compare(
            rank, dict(bucket_cap_mb=cap, find_unused_parameters=True), dict(find_unused_parameters=True), "branchy"
        )
    errors["find_unused accum=2"] = compare(
        rank, dict(find_unused_parameters=True), dict(find_unused_parameters=True), "branchy", accum=2
    )
    rr = RoundRobinProcessGroup.new(3)
    errors["round robin k=3"] = compare(rank, dict(bucket_cap_mb=0, process_group=rr), {}, "convnet")
    errors["reordered (rebuild)"] = compare(rank, dict(bucket_cap_mb=0), {}, "reordered")
    return errors


def compression(ctx):
    """fp16/bf16 hooks against torch's own compression hooks (close) and against fp32 (not equal)."""
    rank = ctx.rank
    out = {}
    for name, torch_hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", default_hooks.bf16_compress_hook)):
        out[name] = (
            compare(rank, dict(comm_hook=name), {}, "mlp", torch_hook=torch_hook, dtype=torch.float32),
            compare(rank, dict(comm_hook=name), {}, "mlp", dtype=torch.float32),
        )
    return out


def global_batch(ctx):
    """DDP over chunks of a global batch equals one process training on the whole batch."""
    rank, world_size = ctx.rank, ctx.world_size
    torch.manual_seed(7)
    data = [(torch.randn(4 * world_size, 6), torch.randn(4 * world_size, 3)) for _ in range(STEPS)]
    ddp = OurDDP(seeded(mlp, 0), bucket_cap_mb=0.001)
    local = seeded(mlp, 0)
    results = []
    for model in (ddp, local):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in data:
            if model is ddp:
                x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    return max_rel_error(*results)


def bucket_order(ctx, rebuild):
    model = OurDDP(seeded(Reordered, 0), bucket_cap_mb=0, rebuild_buckets=rebuild)
    before = [b["names"] for b in model.bucket_info()]
    for _ in range(2):
        model(torch.randn(4, 4)).sum().backward()
    return before, [b["names"] for b in model.bucket_info()]


def timings(ctx):
    out = {}
    for overlap in (True, False):
        model = OurDDP(seeded(ConvNet, 0), bucket_cap_mb=0, overlap=overlap)
        for _ in range(3):
            model(torch.randn(8, 3, 16, 16)).sum().backward()
        out[overlap] = model.last_timing.as_dict()
    return out


# ---- misuse -------------------------------------------------------------------------------------------
def missing_gradient(ctx):
    model = OurDDP(seeded(Branchy, 0), find_unused_parameters=False)
    model(torch.randn(2, 6), use_branch=True).sum().backward()
    model(torch.randn(2, 6), use_branch=True)  # raises: `never` got no gradient


def mismatched_models(ctx):
    OurDDP(nn.Linear(4, 4) if ctx.rank == 0 else nn.Linear(4, 5))


def static_graph_join(ctx):
    """join() on a static graph that has not learnt its graph yet is refused on every rank, before any collective
    of the join; after one iteration it runs."""
    model = OurDDP(nn.Linear(2, 2), static_graph=True)
    try:
        model.join()
        refused = None
    except RuntimeError as e:
        refused = str(e)
    model(torch.ones(1, 2)).sum().backward()
    with model.join():
        for _ in range(1 + ctx.rank):
            model(torch.ones(1, 2)).sum().backward()
    return refused


def freed_after_use(ctx):
    """A DDP that trained and was dropped is freed (its gradient hooks must not keep it alive); [freed, total]."""
    import gc
    import weakref

    refs = []
    for _ in range(3):
        model = OurDDP(mlp())
        model(torch.randn(4, 6)).sum().backward()
        refs.append((weakref.ref(model), weakref.ref(model.reducer)))
        del model
    gc.collect()
    return [sum(m() is None and r() is None for m, r in refs), len(refs)]


def device_matrix_cpu(ctx):
    from experiments import parity

    return parity.device_matrix(ctx, "cpu")


class FakeEvent:
    """A CUDA event's interface on the host clock."""

    def __init__(self):
        self.t = None

    def record(self):
        import time

        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def event_stamps(ctx):
    """Events an EventClock's reused sets hold after each of 6 iterations, all events it has created, and the last
    iteration's timing, per bucket cap and timing mode. Each clock counts its own events: a tracing run's last
    completion callback may run on the communication thread after its iteration returned, and must not count
    against the next configuration."""
    from ddp_impl.timing import EventClock

    out = {}
    for cap in (0, 25):
        for mode in (True, "trace"):
            model = OurDDP(seeded(ConvNet, 0), bucket_cap_mb=cap, timing=mode)
            created = []
            model._clock = EventClock(lambda created=created: created.append(1) or FakeEvent())
            in_sets = []
            for step in range(6):
                model(torch.randn(8, 3, 16, 16)).sum().backward()
                in_sets.append(sum(map(len, model._clock._sets)))
            out[(cap, mode)] = dict(
                in_sets=in_sets,
                created=len(created),
                timing=model.last_timing.as_dict(),
                buckets=len(model.reducer.buckets),
            )
    return out
