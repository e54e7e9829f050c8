"""The ``threads`` system on CPU: ``nn.DataParallel``'s design (replicas of one model on threads of one process),
which ``nn.DataParallel`` itself does not run there, as it only calls the module without a GPU.
"""

from __future__ import annotations

import torch
from torch import nn


class ThreadReplicas(nn.Module):
    """``nn.DataParallel``'s design on CPU threads: one process holds ``k`` replicas of ``module``; every forward
    copies the first replica's parameters and buffers into the others (DataParallel replicates every iteration),
    splits each tensor argument along dim 0 and runs the replicas on ``k`` Python threads; backward runs each
    replica's part on its thread and sums the gradients into the first replica (whose parameters are this
    module's). What it shows beside DDP's processes: one interpreter's GIL, the per-iteration replication and
    the reduction to one replica. Outputs are concatenated (tensors) or their ``loss`` averaged (model outputs)."""

    def __init__(self, module: nn.Module, k: int):
        super().__init__()
        import concurrent.futures
        import copy

        self.module = module
        self.others = [copy.deepcopy(module) for _ in range(k - 1)]  # not submodules: parameters() is the first's
        self.pool = concurrent.futures.ThreadPoolExecutor(k)
        self.roots: list[torch.Tensor] = []

    def forward(self, *args, **kwargs):
        with torch.no_grad():
            for other in self.others:
                for dst, src in zip(
                    [*other.parameters(), *other.buffers()], [*self.module.parameters(), *self.module.buffers()]
                ):
                    dst.copy_(src)
        replicas = [self.module, *self.others]
        k = len(replicas)
        split = lambda v: v.tensor_split(k) if isinstance(v, torch.Tensor) else [v] * k  # noqa: E731
        parts = [split(a) for a in args]
        named = {key: split(v) for key, v in kwargs.items()}
        outs = list(
            self.pool.map(
                lambda i: replicas[i](*(p[i] for p in parts), **{key: v[i] for key, v in named.items()}), range(k)
            )
        )
        if isinstance(outs[0], torch.Tensor):
            self.roots = outs
            return torch.cat(outs)
        self.roots = [o.loss for o in outs]
        return type("Output", (), {"loss": torch.stack(self.roots).mean()})()

    def backward(self, loss: torch.Tensor) -> None:
        grads = torch.autograd.grad(loss, self.roots)  # the gathering step's backward: cheap, on this thread
        list(self.pool.map(lambda rg: rg[0].backward(rg[1]), zip(self.roots, grads)))
        self.roots = []
        with torch.no_grad():
            for mine, *theirs in zip(self.module.parameters(), *(o.parameters() for o in self.others)):
                for p in theirs:
                    if p.grad is not None:
                        mine.grad = p.grad.clone() if mine.grad is None else mine.grad.add_(p.grad)
                        p.grad = None
