"""Per-rank bodies of test_torch_parity: each case runs the same script on ours and on torch's DDP and returns
what to compare (gradients per step, or the error raised). Spawned ranks import this module; the cases about
parameter layout live in layout_cases and are looked up here too."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ddp_impl import DistributedDataParallel as OurDDP
from tests.ddp_impl.case_common import IMPLS, _grads, _net, _outcome, _steps, _x
from tests.ddp_impl.layout_cases import (  # noqa: F401 - test_torch_parity looks every case up here
    round_robin_hook,
    static_graph,
    tied_mixed_frozen,
    view_unused,
)


# ---- 1. an exception inside backward -------------------------------------------------------------------
class _Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("simulated out-of-memory in backward")


class BoomNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(6, 8), nn.Linear(8, 3)
        self.explode = False

    def forward(self, x):
        h = self.first(x)
        return self.second(_Boom.apply(h) if self.explode else h)


def exception_in_backward(ctx, impl):
    torch.manual_seed(0)
    net = BoomNet().double()
    model = IMPLS[impl](net)
    model(_x(ctx.rank, 0)).sum().backward()
    net.explode = True
    try:  # `second` gets its gradient, then backward raises before `first` does
        model(_x(ctx.rank, 1)).sum().backward()
    except RuntimeError:
        pass  # the training loop catches it (an out-of-memory retry) and goes on
    net.explode = False

    def next_step():
        model.zero_grad()
        model(_x(ctx.rank, 2)).sum().backward()
        return "trained on"

    return _outcome(next_step)


# ---- 2. no_sync + find_unused_parameters ------------------------------------------------------------------
class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3), nn.Linear(8, 3)

    def forward(self, x, head):
        return (self.a if head == "a" else self.b)(torch.tanh(self.trunk(x)))


def no_sync_unused(ctx, impl):
    torch.manual_seed(0)
    model = IMPLS[impl](TwoHeads().double(), find_unused_parameters=True)

    def step_fn(step):
        with model.no_sync():
            model(_x(ctx.rank, step), "b").sum().backward()  # `b` used only in the no_sync micro-step
        model(_x(ctx.rank, step + 10), "a").sum().backward()

    return _steps(model, step_fn)


# ---- 3. reentrant activation checkpointing --------------------------------------------------------------
class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = checkpoint(lambda t: torch.tanh(self.first(t)), x, use_reentrant=True)
        h = checkpoint(lambda t: torch.tanh(self.second(t)), h, use_reentrant=True)
        return checkpoint(self.head, h, use_reentrant=True)  # every gradient arrives inside a reentrant backward


def reentrant_checkpoint(ctx, impl):
    torch.manual_seed(0)
    model = IMPLS[impl](Checkpointed().double(), bucket_cap_mb=0)
    return _steps(model, lambda step: model(_x(ctx.rank, step).requires_grad_()).sum().backward())


# ---- 4. dataclass outputs with find_unused_parameters ---------------------------------------------------
@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    extra: dict


class DataclassNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.unused = nn.Linear(6, 3), nn.Linear(3, 3)

    def forward(self, x):
        y = self.body(x)
        return Out(y, {"sq": y * y})


def dataclass_output(ctx, impl):
    torch.manual_seed(0)
    model = IMPLS[impl](DataclassNet().double(), find_unused_parameters=True)

    def step_fn(step):
        out = model(_x(ctx.rank, step))
        (out.logits.sum() + out.extra["sq"].sum()).backward()

    return _steps(model, step_fn)


# ---- 5. a buffer replaced on rank 0 --------------------------------------------------------------------
class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.register_buffer("shift", torch.zeros(3, dtype=torch.float64))

    def forward(self, x):
        return self.lin(x) + self.shift


def replaced_buffer(ctx, impl):
    torch.manual_seed(0)
    model = IMPLS[impl](WithBuffer().double())
    model(_x(ctx.rank, 0)).sum().backward()
    if ctx.rank == 0:
        model.module.shift = torch.full((3,), 5.0, dtype=torch.float64)
    model(_x(ctx.rank, 1)).sum().backward()
    return [model.module.shift.clone()]


# ---- 6. pickling -------------------------------------------------------------------------------------------
def pickling(ctx, impl):
    model = IMPLS[impl](_net(ctx.rank))
    model(_x(ctx.rank, 0)).sum().backward()
    clone = pickle.loads(pickle.dumps(model))
    twin = copy.deepcopy(model)
    grads = []
    for m in (clone, twin):
        m.zero_grad()
        m(_x(ctx.rank, 1)).sum().backward()  # the copies train, averaged across ranks
        grads.append(_grads(m))
    return grads


# ---- 7. backward(create_graph=True) --------------------------------------------------------------------
def create_graph(ctx, impl):
    """torch's DDP itself fails this script here (in-place on a leaf inside its reducer, Gloo/CPU), so the
    reference is ours with a plain backward: create_graph must not change the averaged gradients."""
    model = OurDDP(_net(0))
    model(_x(ctx.rank, 0)).square().sum().backward(create_graph=impl == "ours")
    return [g.detach() for g in _grads(model)]


# ---- 8. broadcast_buffers=False, no trainable parameter --------------------------------------------------
def no_buffer_broadcast(ctx, impl):
    torch.manual_seed(ctx.rank)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4)).double()
    model[1].running_mean.fill_(float(ctx.rank))
    ddp = IMPLS[impl](model, broadcast_buffers=False)
    ddp(_x(ctx.rank, 0)).sum().backward()
    return [model[1].running_mean.clone()] + _grads(ddp)


def frozen_module(ctx, impl):
    model = nn.Linear(3, 3).requires_grad_(False)
    return _outcome(lambda: IMPLS[impl](model) and "built")
