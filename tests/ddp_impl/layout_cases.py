"""Per-rank bodies of test_torch_parity about the parameters DDP is given and how it buckets them: tied,
mixed-dtype and frozen parameters, bucket views beside unused parameters, round-robin groups under a comm hook,
static_graph. Each runs the same script on ours and on torch's DDP and returns the gradients to compare. Spawned
ranks import this module (through torch_cases, where test_torch_parity looks every case up)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

from ddp_impl import DistributedDataParallel as OurDDP
from tests.ddp_impl.case_common import IMPLS, _net, _steps, _x


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
        self.trunk, self.branch, self.never, self.head = (
            nn.Linear(6, 8),
            nn.Linear(8, 8),
            nn.Linear(8, 8),
            nn.Linear(8, 3),
        )

    def forward(self, x, use_branch):
        h = torch.tanh(self.trunk(x))
        return self.head(h + self.branch(h) if use_branch else h)


def view_unused(ctx, impl):
    torch.manual_seed(0)
    ddp = IMPLS[impl](
        Branchy().double(), find_unused_parameters=True, gradient_as_bucket_view=True, bucket_cap_mb=0.0003
    )
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
        self.inp, self.shared, self.never, self.head = (
            nn.Linear(6, 8),
            nn.Linear(8, 8),
            nn.Linear(8, 8),
            nn.Linear(8, 3),
        )

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
