"""The floor of ``python -m experiments bucket-cost``: what any DDP written in Python pays per bucket, so that
ours's cost per bucket can be told apart from what Python and the process group's binding cost anyway."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.autograd.graph import get_gradient_edge


class FloorDDP(torch.nn.Module):
    """The least a DDP written in Python does per bucket, at a bucket per gradient: a hook per gradient that multiplies
    it into its bucket and launches the bucket's allreduce, and once backward is done, per bucket a wait and a copy
    back into ``.grad``. Nothing else (no readiness, order, rebuild, timing or checks): right only for one backward
    per forward in the same gradient order on every rank, which the model here gives."""

    def __init__(self, module: torch.nn.Module, group, world_size: int):
        super().__init__()
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        factor = torch.tensor(1.0 / world_size, dtype=params[0].dtype)
        opts, launched = dist.AllreduceOptions(), []

        def finish():
            for param, view, work in launched:
                work.wait()
                param.grad.copy_(view)
            launched.clear()

        def make(param):
            flat = torch.zeros(param.numel(), dtype=param.dtype, device=param.device)
            view = flat.view_as(param)

            def hook(*_):
                torch.mul(param.grad, factor, out=view)
                if not launched:
                    Variable._execution_engine.queue_callback(finish)
                launched.append((param, view, group.allreduce([flat], opts)))

            return hook

        with torch.enable_grad():
            self._accumulators = [get_gradient_edge(p).node for p in params]
        for acc, param in zip(self._accumulators, params):
            acc.register_hook(make(param))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
