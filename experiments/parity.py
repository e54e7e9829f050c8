"""Ours against torch's DistributedDataParallel on the same training script: the largest relative difference of
gradients and final state per case. The ddp_impl tests run the whole matrix on CPU; ``make gpu-check`` runs
:func:`device_matrix` on CUDA. Models start from a different seed on every rank (the broadcast is tested too),
and every rank feeds different inputs."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_impl import DistributedDataParallel as OurDDP

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


def seeded(factory, seed):
    torch.manual_seed(seed)
    return factory()


def _inputs(name, gen, rank):
    if name.startswith("convnet"):
        return (torch.randn(4, 3, 8, 8, generator=gen),), {}
    if name == "branchy":
        return (torch.randn(4, 6, generator=gen),), {"use_branch": rank == 0}
    if name == "reordered":
        return (torch.randn(4, 4, generator=gen),), {}
    return (torch.randn(4, 6, generator=gen),), {}


def channels_last_convnet() -> nn.Module:
    """ConvNet in channels_last: its convolutions' gradients are not contiguous."""
    return ConvNet().to(memory_format=torch.channels_last)


FACTORIES = {
    "convnet": ConvNet,
    "convnet_channels_last": channels_last_convnet,
    "branchy": Branchy,
    "reordered": Reordered,
    "mlp": mlp,
}


def train(rank, wrap, model_name, accum=1, steps=STEPS, dtype=torch.float64, device="cpu"):
    """Train with SGD-momentum; models start from a different seed on every rank to test the broadcast.

    float64 by default: with 3 ranks Gloo's ring sums a bucket's elements in an order that depends on the bucket
    layout, which differs between implementations, so float32 runs legitimately differ by ~1e-6 after 5 steps.
    """
    model = wrap(seeded(FACTORIES[model_name], 100 + rank).to(device, dtype))
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


def compare(rank, ours_kwargs, torch_kwargs, model_name, accum=1, torch_hook=None, dtype=torch.float64, device="cpu"):
    """Largest relative difference of gradients and final state between ours and torch's DDP."""
    return compare_with(rank, ours_kwargs, torch_kwargs, model_name, accum, torch_hook, dtype, device)[0]


def compare_with(
    rank,
    ours_kwargs,
    torch_kwargs,
    model_name,
    accum=1,
    torch_hook=None,
    dtype=torch.float64,
    device="cpu",
    steps=STEPS,
):
    """:func:`compare`'s difference over ``steps`` iterations, and our trained DDP (for what it recorded)."""

    def ours(m):
        return OurDDP(m, **ours_kwargs)

    def theirs(m):
        ddp = TorchDDP(m, **torch_kwargs)
        if torch_hook is not None:
            ddp.register_comm_hook(None, torch_hook)
        return ddp

    g1, s1, ddp = train(rank, ours, model_name, accum, steps, dtype=dtype, device=device)
    g2, s2, _ = train(rank, theirs, model_name, accum, steps, dtype=dtype, device=device)
    return max(max(max_rel_error(a, b) for a, b in zip(g1, g2)), max_rel_error(s1, s2)), ddp


def device_matrix(ctx, device: str, dtypes=("float64", "float32")) -> dict[str, float]:
    """The comparisons a user's accelerator should pass, on ``device`` (``cuda:<local rank>`` with NCCL; every
    rank on one GPU with Gloo), in each dtype: caps (0.01 MiB: torch before 2.12 refuses 0), the bucket rebuild,
    ``no_sync``, a branch used on one rank only with ``.grad`` as bucket views, ``overlap=False``, and torch's
    fp16 hook (float32). float32 differs by rounding where the ring sums in another order (3+ ranks)."""
    errors = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        cases = {  # name: (ours' kwargs, torch's kwargs, model, no_sync accumulation)
            "convnet cap=0.01": (dict(bucket_cap_mb=0.01), dict(bucket_cap_mb=0.01), "convnet", 1),
            "convnet default cap": ({}, {}, "convnet", 1),
            "reordered (rebuild)": (dict(bucket_cap_mb=0.01), dict(bucket_cap_mb=0.01), "reordered", 1),
            "no_sync accum=3": (dict(bucket_cap_mb=0.01), {}, "convnet", 3),
            "find_unused view": (
                dict(find_unused_parameters=True, gradient_as_bucket_view=True),
                dict(find_unused_parameters=True, gradient_as_bucket_view=True),
                "branchy",
                2,
            ),
            "overlap=False": (dict(overlap=False), {}, "convnet", 1),
        }
        for case, (ours, theirs, model, accum) in cases.items():
            errors[f"{case} {name}"] = compare(ctx.rank, ours, theirs, model, accum, dtype=dtype, device=device)
    if "float32" in dtypes:
        errors["fp16 hook float32"] = compare(
            ctx.rank, dict(comm_hook="fp16"), {}, "mlp", 1, default_hooks.fp16_compress_hook, torch.float32, device
        )
    dist.barrier()
    return errors
