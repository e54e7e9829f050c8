"""Per-rank bodies of the ddp_impl tests, run by ``harness.launch`` (spawned ranks import this module)."""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_impl import DistributedDataParallel as OurDDP
from ddp_impl import RoundRobinProcessGroup

STEPS = 5
CAPS_MB = [0, 0.01, 1, 25, 10000]


class ConvNet(nn.Module):
    """Small CNN with BatchNorm buffers."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6)  # no bias before BN, as in ResNet
        self.conv2, self.bn2 = nn.Conv2d(6, 8, 3, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


class Branchy(nn.Module):
    """A branch used only where ``use_branch`` is true, and a layer no rank ever uses."""

    def __init__(self):
        super().__init__()
        self.trunk, self.branch = nn.Linear(6, 8), nn.Linear(8, 8)
        self.never = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x, use_branch: bool):
        h = torch.relu(self.trunk(x))
        if use_branch:
            h = h + self.branch(h)
        return self.head(h)


class Reordered(nn.Module):
    """Registered in the opposite order of use, so reverse registration order mispredicts gradient order."""

    def __init__(self):
        super().__init__()
        self.late = nn.Linear(16, 4)
        self.early = nn.Linear(4, 16)

    def forward(self, x):
        return self.late(torch.relu(self.early(x)))


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def _seeded(factory, seed):
    torch.manual_seed(seed)
    return factory()


def _inputs(name, gen, rank):
    if name == "convnet":
        return (torch.randn(4, 3, 8, 8, generator=gen),), {}
    if name == "branchy":
        return (torch.randn(4, 6, generator=gen),), {"use_branch": rank == 0}
    if name == "reordered":
        return (torch.randn(4, 4, generator=gen),), {}
    return (torch.randn(4, 6, generator=gen),), {}


FACTORIES = {"convnet": ConvNet, "branchy": Branchy, "reordered": Reordered, "mlp": mlp}


def train(rank, wrap, model_name, accum=1, steps=STEPS, dtype=torch.float64, device="cpu"):
    """Train with SGD-momentum; models start from a different seed on every rank to test the broadcast.

    float64 by default: with 3 ranks Gloo's ring sums a bucket's elements in an order that depends on the bucket
    layout, which differs between implementations, so float32 runs legitimately differ by ~1e-6 after 5 steps.
    """
    model = wrap(_seeded(FACTORIES[model_name], 100 + rank).to(device, dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        for micro in range(accum):
            args, kwargs = _inputs(model_name, gen, rank)
            args = tuple(a.to(device, dtype) for a in args)
            with model.no_sync() if micro < accum - 1 else nullcontext():
                model(*args, **kwargs).square().mean().backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads, [t.detach().clone() for t in model.state_dict().values()], model


def max_rel_error(a: list, b: list) -> float:
    """Largest relative difference; a gradient present in one run and absent in the other is an infinite error."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return float("inf")
        if x is None:
            continue
        x, y = x.double(), y.double()
        worst = max(worst, ((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item())
    return worst


def compare(rank, ours_kwargs, torch_kwargs, model_name, accum=1, torch_hook=None, dtype=torch.float64,
            device="cpu"):
    def ours(m):
        return OurDDP(m, **ours_kwargs)

    def theirs(m):
        ddp = TorchDDP(m, **torch_kwargs)
        if torch_hook is not None:
            ddp.register_comm_hook(None, torch_hook)
        return ddp

    g1, s1, _ = train(rank, ours, model_name, accum, dtype=dtype, device=device)
    g2, s2, _ = train(rank, theirs, model_name, accum, dtype=dtype, device=device)
    return max(max(max_rel_error(a, b) for a, b in zip(g1, g2)), max_rel_error(s1, s2))


def equivalence_matrix(ctx):
    """Max relative error vs torch's DDP for every configuration the issue lists, computed in one spawn."""
    rank = ctx.rank
    errors = {}
    for cap in CAPS_MB:
        for overlap in (True, False):
            errors[f"convnet cap={cap} overlap={overlap}"] = compare(
                rank, dict(bucket_cap_mb=cap, overlap=overlap), {}, "convnet")
    errors["convnet gradient_as_bucket_view"] = compare(
        rank, dict(bucket_cap_mb=0.01, gradient_as_bucket_view=True), dict(gradient_as_bucket_view=True), "convnet")
    for accum in (1, 2, 3, 4):
        errors[f"no_sync accum={accum}"] = compare(rank, dict(bucket_cap_mb=0.01), {}, "convnet", accum)
        errors[f"no_sync accum={accum} view"] = compare(
            rank, dict(bucket_cap_mb=0.01, gradient_as_bucket_view=True), {}, "convnet", accum)
    for cap in (0, 25):
        errors[f"find_unused cap={cap}"] = compare(
            rank, dict(bucket_cap_mb=cap, find_unused_parameters=True), dict(find_unused_parameters=True), "branchy")
    errors["find_unused accum=2"] = compare(rank, dict(find_unused_parameters=True),
                                            dict(find_unused_parameters=True), "branchy", accum=2)
    rr = RoundRobinProcessGroup.new(3)
    errors["round robin k=3"] = compare(rank, dict(bucket_cap_mb=0, process_group=rr), {}, "convnet")
    errors["reordered (rebuild)"] = compare(rank, dict(bucket_cap_mb=0), {}, "reordered")
    return errors


def compression(ctx):
    """fp16/bf16 hooks against torch's own compression hooks (close) and against fp32 (not equal)."""
    rank = ctx.rank
    out = {}
    for name, torch_hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", default_hooks.bf16_compress_hook)):
        out[name] = (compare(rank, dict(comm_hook=name), {}, "mlp", torch_hook=torch_hook, dtype=torch.float32),
                     compare(rank, dict(comm_hook=name), {}, "mlp", dtype=torch.float32))
    return out


def global_batch(ctx):
    """DDP over chunks of a global batch equals one process training on the whole batch."""
    rank, world_size = ctx.rank, ctx.world_size
    torch.manual_seed(7)
    data = [(torch.randn(4 * world_size, 6), torch.randn(4 * world_size, 3)) for _ in range(STEPS)]
    ddp = OurDDP(_seeded(mlp, 0), bucket_cap_mb=0.001)
    local = _seeded(mlp, 0)
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
    model = OurDDP(_seeded(Reordered, 0), bucket_cap_mb=0, rebuild_buckets=rebuild)
    before = [b["names"] for b in model.bucket_info()]
    for _ in range(2):
        model(torch.randn(4, 4)).sum().backward()
    return before, [b["names"] for b in model.bucket_info()]


def timings(ctx):
    out = {}
    for overlap in (True, False):
        model = OurDDP(_seeded(ConvNet, 0), bucket_cap_mb=0, overlap=overlap)
        for _ in range(3):
            model(torch.randn(8, 3, 16, 16)).sum().backward()
        out[overlap] = model.last_timing.as_dict()
    return out


# ---- misuse -------------------------------------------------------------------------------------------
def missing_gradient(ctx):
    model = OurDDP(_seeded(Branchy, 0), find_unused_parameters=False)
    model(torch.randn(2, 6), use_branch=True).sum().backward()
    model(torch.randn(2, 6), use_branch=True)  # raises: `never` got no gradient


def mismatched_models(ctx):
    OurDDP(nn.Linear(4, 4) if ctx.rank == 0 else nn.Linear(4, 5))


def nccl_matrix(ctx):
    """equivalence_matrix's comparisons on one CUDA device per rank over NCCL (run by test_nccl): different
    models and inputs per rank, five iterations each, bucket rebuild, no_sync, unused parameters, a hook."""
    rank, device = ctx.rank, ctx.device
    cases = {  # name: (ours' kwargs, torch's kwargs, model, no_sync accumulation, torch's hook, dtype)
        "convnet cap=0": (dict(bucket_cap_mb=0), {}, "convnet", 1, None, torch.float64),
        "convnet default cap": ({}, {}, "convnet", 1, None, torch.float64),
        "reordered (rebuild)": (dict(bucket_cap_mb=0), {}, "reordered", 1, None, torch.float64),
        "no_sync accum=3": (dict(bucket_cap_mb=0.01), {}, "convnet", 3, None, torch.float64),
        "find_unused view": (dict(find_unused_parameters=True, gradient_as_bucket_view=True),
                             dict(find_unused_parameters=True, gradient_as_bucket_view=True), "branchy", 2, None,
                             torch.float64),
        "fp16 hook": (dict(comm_hook="fp16"), {}, "mlp", 1, default_hooks.fp16_compress_hook, torch.float32),
    }
    errors = {name: compare(rank, ours, theirs, model, accum, hook, dtype, device)
              for name, (ours, theirs, model, accum, hook, dtype) in cases.items()}
    dist.barrier()
    return errors


def join_refused(ctx):
    """join (uneven inputs) is refused, through the method and through torch's Join context manager alike."""
    from torch.distributed.algorithms.join import Join
    model = OurDDP(nn.Linear(2, 2))
    errors = []
    for attempt in (model.join, lambda: Join([model]).__enter__()):
        try:
            attempt()
        except NotImplementedError as e:
            errors.append(str(e))
    return errors


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
