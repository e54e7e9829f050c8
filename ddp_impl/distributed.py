"""The module front-end: wrapping a local model is the only change a training script needs.

1. Construction checks that every rank holds the same parameters, broadcasts rank 0's parameters and buffers,
   and builds the reducer (buckets and gradient hooks).
2. A synchronized forward (grad enabled, outside ``no_sync``) first broadcasts rank 0's buffers, runs the
   module, then arms the reducer for the coming backward; with ``find_unused_parameters`` it walks the autograd
   graph from the outputs to find the parameters this iteration will give no gradient.
3. Inside ``no_sync()`` nothing is communicated: gradients accumulate in ``.grad`` and the next synchronized
   backward reduces their sum.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from .buckets import mb_to_bytes
from .comm_hooks import HOOKS
from .process_groups import RoundRobinProcessGroup
from .reducer import Reducer
from .timing import IterationTiming, clock_for

DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_CAP_MB = 1  # torch's _DEFAULT_FIRST_BUCKET_BYTES, used only with the default cap


class DistributedDataParallel(nn.Module):
    """Bucketed, overlapping data parallelism; see the module docstrings of ``ddp_impl`` for the algorithm.

    ``bucket_cap_mb`` and ``first_bucket_cap_mb`` are MiB like torch's; 0 gives one bucket per parameter. As in
    torch (2.x), the first bucket is capped at 1 MiB only when ``bucket_cap_mb`` is left at its default (25);
    an explicit ``bucket_cap_mb`` caps the first bucket too, unless ``first_bucket_cap_mb`` is given.
    ``overlap=False`` is the paper's non-overlapping baseline (same buckets, all reduced after backward).
    ``comm_hook`` is a callable ``(group, flat_bucket) -> Future`` or one of ``"allreduce"``, ``"fp16"``,
    ``"bf16"``. ``process_group`` may be a :class:`RoundRobinProcessGroup`. ``timing=False`` turns the
    per-iteration instrumentation off (``last_timing`` is then ``None``); the attribute may be flipped
    between iterations.
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = None,
                 first_bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 broadcast_buffers: bool = True, overlap: bool = True, gradient_as_bucket_view: bool = False,
                 rebuild_buckets: bool = True, comm_hook: Callable | str | None = None, timing: bool = True):
        super().__init__()
        if first_bucket_cap_mb is None:
            first_bucket_cap_mb = DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        if bucket_cap_mb is None:
            bucket_cap_mb = DEFAULT_BUCKET_CAP_MB
        cap, first_cap = mb_to_bytes(bucket_cap_mb), mb_to_bytes(first_bucket_cap_mb)
        if isinstance(comm_hook, str):
            if comm_hook not in HOOKS:
                raise ValueError(f"unknown comm_hook {comm_hook!r}; choose one of {sorted(HOOKS)}")
            comm_hook = HOOKS[comm_hook]
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ddp_impl.DistributedDataParallel needs an initialized process group: call "
                               "torch.distributed.init_process_group(...) first")
        self.module = module
        group = process_group if process_group is not None else dist.group.WORLD
        primary = group.primary if isinstance(group, RoundRobinProcessGroup) else group
        self.process_group, self._primary = group, primary
        self.world_size = dist.get_world_size(primary)
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self._sync_buffers_now = True
        self.timing = timing

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the module has no parameter that requires a gradient; there is nothing to reduce")
        self._check_devices(named, dist.get_backend(primary))
        self._verify_same_parameters(module)
        self._buffers_list = [b for b in module.buffers()]
        if self.world_size > 1:
            _broadcast_coalesced([p.detach() for p in module.parameters()] + self._buffers_list, primary)
        self._clock = clock_for(named[0][1].device)
        self.reducer = Reducer(
            [p for _, p in named], [n for n, _ in named], group, self.world_size, cap, first_cap,
            comm_hook or HOOKS["allreduce"], overlap, find_unused_parameters, gradient_as_bucket_view,
            rebuild_buckets)

    @staticmethod
    def _check_devices(named, backend: str) -> None:
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise ValueError(f"parameters span devices {sorted(map(str, devices))}; use one device per process")
        device = next(iter(devices))
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(f"the NCCL backend needs CUDA tensors, but parameter {named[0][0]} is on {device}; "
                             "move the module to its GPU first (module.to(f'cuda:{local_rank}')) or use Gloo")

    def _verify_same_parameters(self, module: nn.Module) -> None:
        """Every rank must wrap the same model, or buckets and collectives would not line up across ranks."""
        mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self._primary)
        reference = everyone[0]
        for rank, theirs in enumerate(everyone[1:], start=1):
            if theirs == reference:
                continue
            for pos, (a, b) in enumerate(zip(reference, theirs)):
                if a != b:
                    raise RuntimeError(f"parameter mismatch at position {pos}: rank 0 has {a[0]} {a[1]} {a[2]}, "
                                       f"rank {rank} has {b[0]} {b[1]} {b[2]}; every rank must wrap the same model")
            raise RuntimeError(f"parameter count mismatch: rank 0 has {len(reference)} parameters, rank {rank} "
                               f"has {len(theirs)}; every rank must wrap the same model")

    # ---- public API -----------------------------------------------------------------------------------
    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after leaving reduces the accumulated sum."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @property
    def last_timing(self) -> IterationTiming | None:
        """Stamps of the last synchronized iteration (``.as_dict()`` for milliseconds)."""
        return self.reducer.last_timing

    def bucket_info(self) -> list[dict]:
        """The current bucket mapping: index, parameter names, element count, bytes."""
        return [b.as_dict() for b in self.reducer.buckets]

    def forward(self, *args, **kwargs):
        reducer = self.reducer
        if reducer.missing:
            names, reducer.missing = reducer.missing, []
            raise RuntimeError(
                f"{len(names)} parameter(s) received no gradient in the previous iteration, so their buckets were "
                f"never reduced: {', '.join(names)}. If these parameters are legitimately unused in some "
                "iterations, construct DistributedDataParallel with find_unused_parameters=True; otherwise make "
                "sure every output that depends on them takes part in the loss.")
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if sync:
            reducer.rebuild_if_pending()
        timing = IterationTiming(self._clock, len(reducer.buckets)) if sync and self.timing else None
        if self._sync_buffers_now and self.broadcast_buffers and self._buffers_list and self.world_size > 1:
            _broadcast_coalesced(self._buffers_list, self._primary)
        # Like torch's DDP: buffers are broadcast before a forward iff the previous forward was synchronized.
        self._sync_buffers_now = sync
        output = self.module(*args, **kwargs)
        if sync:
            if timing is not None:
                timing.forward_end = self._clock.stamp()
            tensors = [t for t in _tensors_in(output) if t.requires_grad] \
                if timing is not None or self.find_unused_parameters else []
            if timing is not None:
                for t in tensors:
                    t.register_hook(lambda grad: _stamp_backward_start(timing))
            unused = self._unused_parameters(tensors) if self.find_unused_parameters else []
            reducer.prepare_for_backward(timing, unused)
        return output

    def _unused_parameters(self, outputs: list[torch.Tensor]) -> list[int]:
        """Parameters the autograd graph of ``outputs`` does not reach: they will get no gradient."""
        reached, seen = set(), set()
        stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)
            variable = getattr(fn, "variable", None)
            if variable is not None:
                reached.add(id(variable))
            stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
        return [i for i, p in enumerate(self.reducer.params) if id(p) not in reached]


def _stamp_backward_start(timing: IterationTiming) -> None:
    if timing.backward_start is None:
        timing.backward_start = timing.clock.stamp()


def _tensors_in(obj) -> Iterator[torch.Tensor]:
    """Every tensor in a nested output (tensor, tuple, list, dict, or a transformers ModelOutput)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)


@torch.no_grad()
def _broadcast_coalesced(tensors: list[torch.Tensor], group) -> None:
    """Broadcast rank 0's tensors with one collective per (device, dtype) instead of one per tensor.

    All collectives are in flight at once (one round trip, not one per kind); the source keeps its tensors.
    """
    src = dist.get_global_rank(group, 0)
    kinds: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.device, t.dtype), []).append(t)
    flats = [torch.cat([t.reshape(-1) for t in same]) for same in kinds.values()]
    works = [dist.broadcast(flat, src=src, group=group, async_op=True) for flat in flats]
    is_source = dist.get_rank() == src
    for same, flat, work in zip(kinds.values(), flats, works):
        work.wait()
        if not is_source:
            torch._foreach_copy_(same, [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in same]), same)])
