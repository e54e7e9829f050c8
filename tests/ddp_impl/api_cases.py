"""Per-rank bodies of test_torch_parity for torch's API around the reducer, each run on ours and on torch's DDP:
comm hooks and the bucket layout they see, a container output with an entry the loss leaves out, and uneven
inputs under ``join()``. Spawned ranks import this module."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from tests.ddp_impl.torch_cases import IMPLS, _grads, _outcome, _steps, _x


# ---- comm hooks and bucket layout --------------------------------------------------------------------------
def _recording(hook, log):
    def recorded(state, bucket):
        log.append(
            (
                bucket.index(),
                [tuple(p.shape) for p in bucket.parameters()],
                bucket.buffer().numel(),
                bucket.is_last(),
                [tuple(g.shape) for g in bucket.gradients()],
            )
        )
        return hook(state, bucket)

    return recorded


def hooks_and_layout(ctx, impl, hook_name, cap, find_unused, as_view=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
    kwargs = {} if cap is None else {"bucket_cap_mb_list" if isinstance(cap, list) else "bucket_cap_mb": cap}
    ddp = IMPLS[impl](model, find_unused_parameters=find_unused, gradient_as_bucket_view=as_view, **kwargs)
    if hook_name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=0.1
        )
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
        return {
            "dict": lambda: {"logits": logits, "aux": aux},
            "tuple": lambda: (logits, aux),
            "namedtuple": lambda: Pair(logits, aux),
            "dataclass": lambda: PairOut(logits, aux),
        }[self.kind]()


def _entry(out, name):
    if isinstance(out, dict):
        return out[name]
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return out[("logits", "aux").index(name)]
    return getattr(out, name)


# torch's DDP trains on these with find_unused_parameters (outputs it can flatten: not a plain dataclass), and
# raises with static_graph; ours must give torch's find_unused_parameters gradients in every one of them
UNUSED_OUTPUT_CONFIGS = [
    dict(find_unused_parameters=True),
    dict(find_unused_parameters=True, gradient_as_bucket_view=True),
    dict(static_graph=True),
    dict(static_graph=True, gradient_as_bucket_view=True),
    dict(find_unused_parameters=True, static_graph=True),
]
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
        self.first, self.norm, self.last, self.side = (
            nn.Linear(6, 16),
            nn.BatchNorm1d(16),
            nn.Linear(16, 3),
            nn.Linear(16, 3),
        )

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
