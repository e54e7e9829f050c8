"""Per-rank bodies of test_torch_parity: each case runs the same script on ours and on torch's DDP and returns
what to compare (gradients per step, or the error raised). Spawned ranks import this module."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import pickle
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
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


# ---- comm hooks and bucket layout --------------------------------------------------------------------------
def _recording(hook, log):
    def recorded(state, bucket):
        log.append((bucket.index(), [tuple(p.shape) for p in bucket.parameters()], bucket.buffer().numel(),
                    bucket.is_last(), [tuple(g.shape) for g in bucket.gradients()]))
        return hook(state, bucket)
    return recorded


def hooks_and_layout(ctx, impl, hook_name, cap, find_unused, as_view=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
    kwargs = {} if cap is None else {"bucket_cap_mb_list" if isinstance(cap, list) else "bucket_cap_mb": cap}
    ddp = IMPLS[impl](model, find_unused_parameters=find_unused, gradient_as_bucket_view=as_view, **kwargs)
    if hook_name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=0.1)
        hook = powerSGD_hook.powerSGD_hook
    else:
        state, hook = None, getattr(default_hooks, f"{hook_name}_hook")
    log: list = []
    ddp.register_comm_hook(state, _recording(hook, log))
    grads, layouts = [], []
    for step in range(4):
        ddp.zero_grad()
        log.clear()
        ddp(_x(ctx.rank, step).float()).square().sum().backward()
        grads.append(_grads(ddp))
        layouts.append(sorted(log))
    return grads, layouts


# ---- 11. a container output with an entry the loss does not use -------------------------------------------
class Pair(NamedTuple):
    logits: torch.Tensor
    aux: torch.Tensor


@dataclasses.dataclass
class PairOut:
    logits: torch.Tensor
    aux: torch.Tensor


class AuxHead(nn.Module):
    """Logits and an auxiliary head's output, returned in the container ``kind``."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.trunk, self.head, self.aux = nn.Linear(6, 8), nn.Linear(8, 3), nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        logits, aux = self.head(h), self.aux(h)
        return {"dict": lambda: {"logits": logits, "aux": aux}, "tuple": lambda: (logits, aux),
                "namedtuple": lambda: Pair(logits, aux), "dataclass": lambda: PairOut(logits, aux)}[self.kind]()


def _entry(out, name):
    if isinstance(out, dict):
        return out[name]
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return out[("logits", "aux").index(name)]
    return getattr(out, name)


# torch's DDP trains on these with find_unused_parameters (outputs it can flatten: not a plain dataclass), and
# raises with static_graph; ours must give torch's find_unused_parameters gradients in every one of them
UNUSED_OUTPUT_CONFIGS = [dict(find_unused_parameters=True), dict(find_unused_parameters=True,
                         gradient_as_bucket_view=True), dict(static_graph=True),
                         dict(static_graph=True, gradient_as_bucket_view=True),
                         dict(find_unused_parameters=True, static_graph=True)]
OUTPUT_KINDS = ("dict", "tuple", "namedtuple", "dataclass")


def unused_output_entry(ctx, impl, kinds=OUTPUT_KINDS, configs=UNUSED_OUTPUT_CONFIGS):
    """Per (kind, config index, usage): the loss uses ``aux`` never, or on rank 0 only (then it is averaged)."""
    out = {}
    for kind in kinds:
        for k, config in enumerate(configs):
            for aux_on in ("never", "rank0"):
                torch.manual_seed(0)
                group = dist.new_group(backend="gloo")  # a raise on one rank must not unmatch later collectives
                ddp = IMPLS[impl](AuxHead(kind).double(), process_group=group, bucket_cap_mb=0, **config)

                def step_fn(step):
                    o = ddp(_x(ctx.rank, step))
                    loss = _entry(o, "logits").square().sum()
                    if aux_on == "rank0" and ctx.rank == 0:
                        loss = loss + _entry(o, "aux").sum()
                    loss.backward()
                out[(kind, k, aux_on)] = _outcome(lambda: _steps(ddp, step_fn, steps=4))
    return out


# ---- uneven inputs: join() -----------------------------------------------------------------------------
class JoinNet(nn.Module):
    """A buffer (BatchNorm's running stats differ per rank: the broadcast's source shows) and a branch the loss
    uses only on some steps (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.first, self.norm, self.last, self.side = nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Linear(16, 3), \
            nn.Linear(16, 3)

    def forward(self, x, side=True):
        h = torch.tanh(self.norm(self.first(x)))
        return self.last(h) + (self.side(h) if side else 0)


# (name, DDP arguments, join arguments, steps of rank r, every other step in no_sync, hook)
JOIN_CASES = [
    ("default", dict(), dict(), lambda r: 2 + 2 * r, False, None),
    ("divide_by_training_ranks", dict(), dict(divide_by_initial_world_size=False), lambda r: 2 + 2 * r, False, None),
    ("rank0_longest_many_buckets", dict(bucket_cap_mb=0), dict(), lambda r: 5 - 2 * r, False, None),
    ("a_rank_without_inputs", dict(bucket_cap_mb=0), dict(), lambda r: 3 * r, False, None),
    ("unused", dict(find_unused_parameters=True), dict(), lambda r: 2 + 3 * r, False, None),
    ("no_sync", dict(), dict(), lambda r: 2 + 3 * r, True, None),
    ("bucket_view_fp16_hook", dict(gradient_as_bucket_view=True), dict(), lambda r: 1 + 2 * r, False, "fp16"),
]


def uneven_inputs(ctx, impl, case):
    """Ranks run different numbers of steps inside ``join()``: gradients of every step, then the final model."""
    name, kwargs, join_kwargs, steps_of, no_sync, hook = next(c for c in JOIN_CASES if c[0] == case)
    torch.manual_seed(ctx.rank)  # ranks start different: construction and the final sync must fix that
    ddp = IMPLS[impl](JoinNet().double(), **kwargs)
    if hook:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    grads, unused_side = [], kwargs.get("find_unused_parameters")
    with ddp.join(**join_kwargs):
        for step in range(steps_of(ctx.rank)):
            optimizer.zero_grad()
            with ddp.no_sync() if no_sync and step % 2 else contextlib.nullcontext():
                ddp(_x(ctx.rank, step), side=not unused_side or step % 3 == 0).square().sum().backward()
            grads.append(_grads(ddp))
            optimizer.step()
    return grads, [t.detach().clone() for t in ddp.module.state_dict().values()]
