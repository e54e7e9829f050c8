"""Per-rank bodies of test_torch_parity: each case runs the same script on ours and on torch's DDP and returns
what to compare (gradients per step, or the error raised). Spawned ranks import this module."""
from __future__ import annotations

import copy
import dataclasses
import pickle

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

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


# ---- 9. tied, mixed-dtype and frozen parameters; gradient_as_bucket_view with unused parameters ------------
class TiedMixed(nn.Module):
    """An encoder/decoder pair sharing one weight, a float32 block between float64 ones, a frozen layer."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec = nn.Linear(6, 8, bias=False), nn.Linear(8, 6, bias=False)
        self.dec.weight = nn.Parameter(self.enc.weight.detach().t().clone())
        self.enc.weight = self.dec.weight  # tied: registered once, gradient from both uses
        self.mid = nn.Linear(8, 8).float()
        self.frozen = nn.Linear(6, 6).requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(x @ self.dec.weight)
        h = self.mid(h.float()).double()
        return self.frozen(h @ self.dec.weight.t())


def tied_mixed_frozen(ctx, impl):
    torch.manual_seed(0)
    model = TiedMixed().double()
    model.mid.float()
    ddp = IMPLS[impl](model, bucket_cap_mb=0.0002)
    return _steps(ddp, lambda step: ddp(_x(ctx.rank, step)).square().sum().backward())


class Branchy(nn.Module):
    """A branch used on rank 0 only and a layer no rank uses."""

    def __init__(self):
        super().__init__()
        self.trunk, self.branch, self.never, self.head = (nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8),
                                                          nn.Linear(8, 3))

    def forward(self, x, use_branch):
        h = torch.tanh(self.trunk(x))
        return self.head(h + self.branch(h) if use_branch else h)


def view_unused(ctx, impl):
    torch.manual_seed(0)
    ddp = IMPLS[impl](Branchy().double(), find_unused_parameters=True, gradient_as_bucket_view=True,
                      bucket_cap_mb=0.0003)
    return _steps(ddp, lambda step: ddp(_x(ctx.rank, step), ctx.rank == 0).sum().backward())


def round_robin_hook(ctx, impl):
    """ours: buckets alternate over two process groups, each compressed by torch's fp16 hook; torch: one group."""
    torch.manual_seed(0)
    if impl == "ours":
        from ddp_impl import RoundRobinProcessGroup
        group = RoundRobinProcessGroup.new(2)
        ddp = OurDDP(_net(0).float(), process_group=group, bucket_cap_mb=0)
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    else:
        ddp = TorchDDP(_net(0).float(), bucket_cap_mb=0)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return _steps(ddp, lambda step: ddp(_x(ctx.rank, step).float()).square().sum().backward())


# ---- 10. static_graph ------------------------------------------------------------------------------------
class Static(nn.Module):
    """One layer checkpointed twice (its hook fires twice per backward), one never used, no find_unused."""

    def __init__(self):
        super().__init__()
        self.inp, self.shared, self.never, self.head = (nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8),
                                                        nn.Linear(8, 3))

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for _ in range(2):
            h = checkpoint(lambda t: torch.tanh(self.shared(t)), h, use_reentrant=True)
        return self.head(h)


def static_graph(ctx, impl):
    out = []
    for as_view in (False, True):
        torch.manual_seed(0)
        ddp = IMPLS[impl](Static().double(), static_graph=True, gradient_as_bucket_view=as_view, bucket_cap_mb=0)
        out.append(_steps(ddp, lambda step: ddp(_x(ctx.rank, step)).sum().backward(), steps=4))
    return out
