"""The reducer: gradient hooks, bucket readiness, in-order launch, and finalize.

1. Each parameter gets a post-accumulate-grad hook. When its gradient is final for this backward, the hook
   writes it, divided by the world size, into the parameter's slice of a flat bucket.
2. When every slice of a bucket is written the bucket is ready; ready buckets are launched (async allreduce
   through the comm hook) strictly in bucket-index order, so every rank issues the same collectives in the
   same order even if gradients arrive in a different order.
3. The first hook queues a callback that runs when autograd finishes: it waits for the buckets in order and
   copies each one's averages back into ``.grad`` as soon as it is reduced, while later buckets are still in
   flight, as torch's reducer does (or leaves ``.grad`` as a view of the bucket).
4. With ``find_unused_parameters`` the front-end tells us which parameters the forward graph did not reach;
   they are marked ready with the first hook, and an allreduced usage bitmap says which were unused on every
   rank: their ``.grad`` is left untouched.
5. The order in which gradients became ready in the first iteration (rank 0's) becomes the bucket order from
   the second iteration on (gradient order prediction). Like torch, the buckets are rebuilt at the start of
   the next synchronized forward, before any activation exists, and the old ones are freed first unless
   ``.grad`` still lives in them (``gradient_as_bucket_view``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable

from .buckets import Bucket, ParamSpec, assign_buckets
from .process_groups import RoundRobinProcessGroup
from .timing import IterationTiming


class Reducer:
    def __init__(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], group, world_size: int,
                 cap_bytes: int, first_cap_bytes: int, comm_hook: Callable, overlap: bool,
                 find_unused_parameters: bool, gradient_as_bucket_view: bool, rebuild_buckets: bool):
        self.params = list(params)
        self.names = list(names)
        self.group = group
        self.world_size = world_size
        self._scale = 1.0 / world_size  # multiply, not divide: bitwise the same averages as torch's reducer
        self.cap_bytes, self.first_cap_bytes = cap_bytes, first_cap_bytes
        self.comm_hook = comm_hook
        self.overlap = overlap
        self.find_unused = find_unused_parameters
        self.as_view = gradient_as_bucket_view
        self.rebuild_pending = rebuild_buckets  # rebuilt once, after the first synchronized iteration
        self.specs = [ParamSpec.of(n, p) for n, p in zip(self.names, self.params)]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._build(assign_buckets(self.specs, cap_bytes, first_cap_bytes))

        self.expect_hooks = False  # True between a synchronized forward and the end of its backward
        self.timing: IterationTiming | None = None
        self.last_timing: IterationTiming | None = None
        self.missing: list[str] = []  # parameters that got no gradient in the last iteration
        self._unused: list[int] = []
        self._order: list[int] | None = [] if rebuild_buckets else None
        self._callback_queued = False
        n = len(self.params)
        self._local_used = torch.zeros(n, dtype=torch.int32, device=self.params[0].device) \
            if self.find_unused and n else None
        self._used_work = None
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                              for i, p in enumerate(self.params)]

    # ---- bucket storage -------------------------------------------------------------------------------
    def _build(self, buckets: list[Bucket]) -> None:
        """Allocate one flat tensor per bucket and a view of it per parameter."""
        self.buckets = buckets
        self.flats = [torch.zeros(b.numel, dtype=b.dtype, device=b.device) for b in buckets]
        self.views: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        self.bucket_of = [0] * len(self.params)
        for b, flat in zip(buckets, self.flats):
            offset = 0
            for i in b.param_indices:
                numel = self.specs[i].numel
                self.views[i] = flat[offset:offset + numel].view(self.params[i].shape)
                self.bucket_of[i] = b.index
                offset += numel
        self.bucket_sizes = [len(b.param_indices) for b in buckets]
        self._bucket_views = [[self.views[i] for i in b.param_indices] for b in buckets]

    def _group_for(self, bucket_index: int):
        if isinstance(self.group, RoundRobinProcessGroup):
            return self.group.group_for(bucket_index)
        return self.group

    @property
    def primary_group(self):
        return self.group.primary if isinstance(self.group, RoundRobinProcessGroup) else self.group

    def rebuild_if_pending(self) -> None:
        """Called at the start of a synchronized forward (every rank, before any activation exists)."""
        if self.rebuild_pending and self._order:
            self._rebuild()

    def _rebuild(self) -> None:
        """Re-bucket in the gradient-ready order rank 0 observed, so early gradients share early buckets."""
        self.rebuild_pending = False
        order = self._order or []
        self._order = None
        seen = set(order)
        order = order + [i for i in reversed(range(len(self.params))) if i not in seen]
        device = self.params[0].device if self.params[0].device.type == "cuda" else torch.device("cpu")
        order_t = torch.tensor(order, dtype=torch.int64, device=device)
        dist.broadcast(order_t, src=dist.get_global_rank(self.primary_group, 0), group=self.primary_group)
        old_views = self.views
        if not self.as_view:  # nothing lives in the old buckets between iterations: free them first (like torch)
            old_views = self.views = self.flats = self._bucket_views = None  # type: ignore[assignment]
        self._build(assign_buckets(self.specs, self.cap_bytes, self.first_cap_bytes, order_t.tolist()))
        if self.as_view:  # .grad still points into the old buckets: move it into the new ones
            for p, old, new in zip(self.params, old_views, self.views):
                if p.grad is not None and p.grad.data_ptr() == old.data_ptr():
                    new.copy_(old)
                    p.grad = new

    # ---- per iteration --------------------------------------------------------------------------------
    def prepare_for_backward(self, timing: IterationTiming | None, unused: list[int]) -> None:
        """Called by a synchronized forward: arm the hooks for the coming backward."""
        self.expect_hooks = True
        self.timing = timing
        self._unused = unused
        self._pending = list(self.bucket_sizes)
        self._ready = [False] * len(self.params)
        self._next_launch = 0
        self._futures: list = [None] * len(self.buckets)
        if self._local_used is not None:
            self._local_used.zero_()
            self._used_work = None

    def _make_hook(self, i: int):
        def hook(param: torch.Tensor) -> None:
            if self.expect_hooks:
                self._grad_ready(i)
        return hook

    def _grad_ready(self, i: int) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            Variable._execution_engine.queue_callback(self._finalize)
            for j in self._unused:
                self._mark_ready(j)
        if self._local_used is not None:
            self._local_used[i] = 1
        if self._order is not None:
            self._order.append(i)
        self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        if self._ready[i]:
            raise RuntimeError(
                f"parameter {self.names[i]} received its gradient twice in one backward; this DDP supports one "
                "backward per forward (no reentrant backward, no parameter used by two separate backward passes)")
        self._ready[i] = True
        grad, view = self.params[i].grad, self.views[i]
        if grad is None:
            view.zero_()
        elif grad.is_sparse:
            raise RuntimeError(f"parameter {self.names[i]} has a sparse gradient, which this DDP does not support")
        elif self.as_view and grad.data_ptr() == view.data_ptr():
            grad.mul_(self._scale)
        else:
            torch.mul(grad, self._scale, out=view)
            if self.as_view:
                self.params[i].grad = view
        b = self.bucket_of[i]
        self._pending[b] -= 1
        if self._pending[b] == 0 and self.overlap:
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets) and self._pending[self._next_launch] == 0:
            self._launch(self._next_launch)
            self._next_launch += 1
        if self._next_launch == len(self.buckets) and self._local_used is not None:
            self._used_work = dist.all_reduce(self._local_used, group=self.primary_group, async_op=True)

    def _launch(self, b: int) -> None:
        timing = self.timing
        if timing is not None:
            timing.bucket_launch[b] = timing.clock.stamp()
        self._futures[b] = self.comm_hook(self._group_for(b), self.flats[b])

    def _finalize(self) -> None:
        """Runs once autograd has finished: wait for each bucket, write its averages back to ``.grad``."""
        self._callback_queued = False
        self.expect_hooks = False
        timing = self.timing
        if timing is not None:
            timing.backward_end = timing.clock.stamp()
            if timing.backward_start is None:
                timing.backward_start = timing.backward_end
        if not self.overlap and all(p == 0 for p in self._pending):
            self._launch_ready()
        self.missing = [] if all(self._ready) else [n for n, ready in zip(self.names, self._ready) if not ready]
        futures, self._futures = self._futures, []  # their values hold the buckets: not kept past this iteration
        # The common case: each bucket goes back to .grad as soon as it is reduced, while later buckets are still
        # in flight. Views, unused-parameter detection and missing .grad go through _write_back at the end.
        grads = None
        if not (self.missing or self.as_view or self._local_used is not None):
            grads = [p.grad for p in self.params]
            if any(g is None for g in grads):
                grads = None
        if timing is not None:  # finish stamped here, not by a callback on the comm thread; on the host clock a
            # bucket already done now reads as done now, not after the write-back of the buckets before it
            done = [timing.clock.on_host and f is not None and f.done() for f in futures]
            timing.comm_end = now = timing.clock.stamp()
        for b, f in enumerate(futures):
            if f is None:
                continue
            value = f.wait()
            if timing is not None:
                if done[b]:
                    timing.bucket_finish[b] = now
                else:
                    timing.bucket_finish[b] = timing.comm_end = timing.clock.stamp()
            if self.missing:
                continue  # wait anyway: the launched buckets must finish on every rank
            if isinstance(value, list):  # a collective's own future: [reduced tensor]
                value = value[0]
            if value is not self.flats[b]:
                self.flats[b].copy_(value)
            if grads is not None:
                torch._foreach_copy_([grads[i] for i in self.buckets[b].param_indices], self._bucket_views[b])
        if self.missing:
            return  # the next forward reports the missing ones
        if grads is None:
            unused_everywhere = set()
            if self._used_work is not None:
                self._used_work.wait()
                unused_everywhere = set((self._local_used == 0).nonzero().flatten().tolist())
            self._write_back(unused_everywhere)
        self.last_timing = timing

    def _write_back(self, skip: set[int]) -> None:
        """The rarer cases after all buckets are reduced: ``.grad`` as bucket views, unused-parameter detection
        (``skip``: unused on every rank), or a parameter without ``.grad`` yet."""
        if self.as_view:
            for i, p in enumerate(self.params):
                if i not in skip and (p.grad is None or p.grad.data_ptr() != self.views[i].data_ptr()):
                    p.grad = self.views[i]
            return
        grads, views = [], []
        for i, p in enumerate(self.params):
            if i in skip:
                continue
            if p.grad is None:
                p.grad = self.views[i].clone()
            else:
                grads.append(p.grad)
                views.append(self.views[i])
        if grads:
            torch._foreach_copy_(grads, views)

    def remove_hooks(self) -> None:
        for h in self._hook_handles:
            h.remove()
