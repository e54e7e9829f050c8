"""What the cases of test_torch_parity share: both DDPs by name, a small float64 net, per-rank inputs, and the
gradients of a few steps or the type of the error raised. Spawned ranks import this module."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_impl import DistributedDataParallel as OurDDP

IMPLS = {"ours": OurDDP, "torch": TorchDDP}


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def _x(rank, step, n=6):
    return torch.randn(4, n, generator=torch.Generator().manual_seed(100 * rank + step), dtype=torch.float64)


def _grads(model):
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _steps(model, backward_step, steps=3):
    """Gradients after each of ``steps`` iterations of ``backward_step(step)``, zeroed before each."""
    grads = []
    for step in range(steps):
        model.zero_grad()
        backward_step(step)
        grads.append(_grads(model))
    return grads


def _outcome(fn):
    """A case's result, or the type of the error it raised (compared across DDPs)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the type is the outcome
        return f"raised {type(e).__name__}"
