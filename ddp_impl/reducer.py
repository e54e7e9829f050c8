"""The reducer: gradient hooks, bucket readiness, in-order launch, and finalize.

1. Each parameter's gradient accumulator gets a hook. When its gradient is final for this backward, the hook
   counts it against its bucket, and copies it into its slice of the bucket's flat tensor if it is large
   (divided by the world size unless a comm hook is registered: then averaging is the hook's job, as in torch).
2. When a bucket's last gradient is final, its small gradients are copied and divided in one fused copy and
   one fused multiply (a kernel per tiny gradient would cost host time the C++ reducer does not pay), and the
   bucket is ready. Ready buckets are launched (our allreduce, or the registered comm hook)
   strictly in bucket-index order, so every rank issues the same collectives in the same order even if
   gradients arrive in a different order.
3. When the last bucket is ready, a callback is queued on the running backward (like torch's reducer, so a
   reentrant backward, e.g. reentrant activation checkpointing, finishes inside it). When autograd finishes it
   waits for the buckets in order and copies each one's averages back into ``.grad`` as soon as it is reduced,
   while later buckets are still in flight (or leaves ``.grad`` as a view of the bucket). If a backward began
   but never readied every bucket (a parameter got no gradient, or backward raised), the next synchronized
   forward raises instead of training on gradients that were never averaged.
4. With ``find_unused_parameters`` the front-end tells us which parameters the forward graph did not reach;
   they are marked ready with the first hook, and an allreduced usage bitmap (usage inside ``no_sync`` counts,
   as in torch) says which were unused on every rank: their ``.grad`` is left untouched.
5. With ``static_graph`` the first synchronized backward only counts how often each parameter's hook fires
   (reentrant checkpointing can fire it twice) and reduces everything once autograd is done; from then on a
   parameter is ready when its hook has fired that many times, the ones that never fired are marked ready with
   the first hook (as with ``find_unused_parameters``), and those unused on every rank keep their ``.grad``.
6. Before the first iteration the buckets follow torch's initial layout (``buckets.initial_buckets``). The order
   in which gradients became ready in the first iteration (rank 0's) becomes the bucket order from the second
   iteration on (gradient order prediction); like torch, not with ``find_unused_parameters``. The buckets are
   rebuilt at the start of the next synchronized forward, before any activation exists, and the old ones are
   freed first unless ``.grad`` still lives in them (``gradient_as_bucket_view``).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.autograd.graph import get_gradient_edge

from .buckets import Bucket, ParamSpec, assign_buckets, initial_buckets
from .comm_hooks import GradBucket
from .process_groups import RoundRobinProcessGroup
from .timing import IterationTiming


# A gradient this large (elements) is copied into its bucket by its own hook, as soon as it is final: its copy
# costs far more than launching it, and copying it later would delay the bucket's launch. Smaller ones wait for
# the bucket's fused copy (on CPU, 64 Ki float32 elements take tens of microseconds; a launch takes a few).
EAGER_COPY_NUMEL = 1 << 16


def hook_accumulators(params: Sequence[torch.Tensor], make_hook: Callable[[int], Callable]) -> tuple[list, list]:
    """``make_hook(i)`` on parameter i's gradient accumulator, as torch's reducer hooks it: it runs once the incoming
    gradient is accumulated and freed, the moment DDP's buckets see a gradient ready. A post-accumulate-grad hook on
    the parameter runs while that temporary is alive, which leaves glibc trimming and re-faulting the heap under
    large gradients (BERT-base's 9 MiB). Returns (accumulators, handles): hold the
    accumulators, or autograd builds new ones and the hooks never run."""
    with torch.enable_grad():
        accumulators = [get_gradient_edge(p).node for p in params]
    return accumulators, [acc.register_hook(make_hook(i)) for i, acc in enumerate(accumulators)]


class Reducer:
    def __init__(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], group, world_size: int,
                 cap_bytes: int | list[int], first_cap_bytes: int, overlap: bool, find_unused_parameters: bool,
                 gradient_as_bucket_view: bool, rebuild_buckets: bool, static_graph: bool = False):
        self.params = list(params)
        self.names = list(names)
        self.group = group
        self.world_size = world_size
        self._scale = 1.0 / world_size  # multiply, not divide: bitwise the same averages as torch's reducer
        self.cap_bytes, self.first_cap_bytes = cap_bytes, first_cap_bytes
        self.comm_hook: Callable | None = None  # torch's hook API; None: our own averaging allreduce
        self.comm_state = None
        self.overlap = overlap
        if static_graph:  # the first iteration finds the unused parameters once and for all
            find_unused_parameters = False
        self.find_unused = find_unused_parameters
        self.static = static_graph
        self._expected: list[int] | None = None  # static graph: hooks per parameter per backward, once learnt
        self._static_skip: set[int] = set()  # static graph: parameters unused on every rank
        self._static_unused: list[int] = []  # static graph: parameters unused on this rank
        self.as_view = gradient_as_bucket_view
        rebuild = rebuild_buckets and not find_unused_parameters  # torch never rebuilds with find_unused
        self.rebuild_pending = rebuild  # rebuilt once, after the first synchronized iteration
        self.specs = [ParamSpec.of(n, p) for n, p in zip(self.names, self.params)]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        if rebuild_buckets:
            self._build(initial_buckets(self.specs, cap_bytes, first_cap_bytes, find_unused_parameters))
        else:  # the paper's static layout: reverse registration order, capped from the first iteration
            self._build(assign_buckets(self.specs, cap_bytes, first_cap_bytes))

        self.expect_hooks = False  # True between a synchronized forward and the end of its backward
        self._started = False  # a hook of the armed backward has run
        self.timing: IterationTiming | None = None
        self.last_timing: IterationTiming | None = None
        self._unused: list[int] = []
        self._order: list[int] | None = [] if rebuild else None
        n = len(self.params)
        self._used = bytearray(n) if self.find_unused else None  # local usage since the last bitmap allreduce
        self._used_work = self._used_map = None
        self._local_unused = False
        self._warned_create_graph = False
        self._finalize_inline = False
        self._accumulators, self._hook_handles = hook_accumulators(self.params, self._make_hook)

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
        self._bucket_params = [[self.params[i] for i in b.param_indices] for b in buckets]
        self._deferred = [[i for i in b.param_indices if self.specs[i].numel < EAGER_COPY_NUMEL] for b in buckets]
        self._deferred_views = [[self.views[i] for i in d] for d in self._deferred]
        self._deferred_params = [[self.params[i] for i in d] for d in self._deferred]

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
            old_views = self.views = self.flats = self._bucket_views = self._deferred_views = None  # type: ignore
        self._build(assign_buckets(self.specs, self.cap_bytes, self.first_cap_bytes, order_t.tolist()))
        if self.as_view:  # .grad still points into the old buckets: move it into the new ones
            for p, old, new in zip(self.params, old_views, self.views):
                if p.grad is not None and p.grad.data_ptr() == old.data_ptr():
                    new.copy_(old)
                    p.grad = new

    # ---- per iteration --------------------------------------------------------------------------------
    def check_prior_finished(self) -> None:
        """Raise if the last armed backward began but never readied every bucket: its gradients were never
        averaged (a parameter got no gradient, or backward raised). Like torch, the DDP stays in this state."""
        if not (self.expect_hooks and self._started):
            return
        missing = [f"{n} (index {i})" for i, (n, ready) in enumerate(zip(self.names, self._ready)) if not ready]
        raise RuntimeError(
            "Expected to have finished reduction in the prior iteration before starting a new one: the previous "
            f"backward did not reduce all gradients, so training on would use gradients that were never averaged. "
            f"Parameters that did not receive grad on rank {dist.get_rank()}: {', '.join(missing)}. "
            "Either that backward raised an exception (gradients of a failed backward cannot be averaged; rebuild "
            "the DDP model, or retry in a way that completes backward on every rank), or these parameters took no "
            "part in the loss: if they are legitimately unused in some iterations, construct "
            "DistributedDataParallel with find_unused_parameters=True; otherwise make sure every output that "
            "depends on them takes part in the loss.")

    def prepare_for_backward(self, timing: IterationTiming | None, unused: list[int]) -> None:
        """Called by a synchronized forward: arm the hooks for the coming backward."""
        self.expect_hooks = True
        self._started = False
        self.timing = timing
        self._unused = unused
        self._pending = list(self.bucket_sizes)
        self._buckets_left = len(self.buckets)
        self._ready = [False] * len(self.params)
        self._next_launch = 0
        self._futures: list = [None] * len(self.buckets)
        if self.static:  # the reducer knows the unused parameters itself once the first backward has run
            self._fired = [0] * len(self.params)
            self._unused = self._static_unused

    def _make_hook(self, i: int):
        # The hook reaches the reducer through a weak reference: a strong one would make a cycle through the
        # parameter that Python's collector cannot see, keeping every DDP ever built in the process alive.
        reducer = weakref.ref(self)

        def hook(grad_inputs, grad_outputs) -> None:
            self = reducer()
            if self is None:
                return
            if self.expect_hooks:
                self._grad_ready(i)
            elif self._used is not None:
                self._used[i] = 1  # a no_sync backward: its usage counts at the next synchronized one
        return hook

    def _grad_ready(self, i: int) -> None:
        learning = self.static and self._expected is None  # a static graph's first backward
        if not self._started:
            self._started = True
            if learning:  # like torch: reduce everything once this backward is over
                Variable._execution_engine.queue_callback(self._learn_static_graph)
            for j in self._unused:
                self._mark_ready(j)
        if self._used is not None and self.params[i].grad is not None:  # as torch: a hook that fired without a
            self._used[i] = 1  # gradient (an output the loss left out) is no use of the parameter
        if self.static:
            self._fired[i] += 1
            if learning or self._fired[i] < self._expected[i]:
                if learning and self._order is not None and self._fired[i] == 1:
                    self._order.append(i)
                return
        if self._order is not None:
            self._order.append(i)
        self._mark_ready(i)

    def _learn_static_graph(self) -> None:
        """The end of a static graph's first backward: keep the hook counts, find the parameters unused on
        every rank, then reduce every bucket (none was launched during this backward)."""
        self._expected = self._fired
        self._static_unused = [i for i, n in enumerate(self._fired) if n == 0]
        device = self.params[0].device
        used = torch.tensor([n > 0 for n in self._fired], dtype=torch.int32, device=device)
        dist.all_reduce(used, group=self.primary_group)
        self._static_skip = set((used == 0).nonzero().flatten().tolist())
        self._finalize_inline = True  # _mark_ready must not queue a finalize: it runs right here
        for i in range(len(self.params)):
            self._mark_ready(i)
        self._finalize_inline = False
        self._finalize()

    def _mark_ready(self, i: int) -> None:
        if self._ready[i]:
            raise RuntimeError(
                f"parameter {self.names[i]} received its gradient twice in one backward, or it was taken as unused "
                "by find_unused_parameters (no tensor of the forward's output reaches it: is the output a type "
                "whose tensors cannot be found, or is the parameter behind reentrant checkpointing?); this DDP "
                "supports one backward per forward and no parameter used by two separate backward passes")
        self._ready[i] = True
        if self.specs[i].numel >= EAGER_COPY_NUMEL:  # large: copied now, while backward computes the rest
            self._fill_one(i, self.params[i].grad, self._scale if self.comm_hook is None else None)
        b = self.bucket_of[i]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self._fill(b)
            if self.timing is not None and self.timing.bucket_ready is not None:
                self.timing.bucket_ready[b] = self.timing.clock.stamp()
            self._buckets_left -= 1
            if self.overlap:
                self._launch_ready()
            if self._buckets_left == 0 and not self._finalize_inline:  # on the backward running now, which
                Variable._execution_engine.queue_callback(self._finalize)  # may be a reentrant one

    def _fill(self, b: int) -> None:
        """Bucket ``b``'s small gradients, once all are final, into its flat tensor, averaged unless a comm hook
        averages: one fused copy and one fused multiply, not a kernel each (on a fast GPU the host issuing kernels
        is the bottleneck). Bitwise torch's average: the same multiply by 1 / world size."""
        params = self._deferred_params[b]
        if not params:
            return
        grads = [p.grad for p in params]
        scale = self._scale if self.comm_hook is None else None
        if self.as_view or any(g is None or g.requires_grad or g.is_sparse for g in grads):
            for i, grad in zip(self._deferred[b], grads):
                self._fill_one(i, grad, scale)
            return
        views = self._deferred_views[b]
        torch._foreach_copy_(views, grads)
        if scale is not None:
            torch._foreach_mul_(views, scale)

    def _fill_one(self, i: int, grad: torch.Tensor | None, scale: float | None) -> None:
        """The rarer cases, one gradient at a time: none yet, sparse, ``create_graph``, ``.grad`` as a view."""
        view = self.views[i]
        if grad is None:
            view.zero_()
        elif grad.is_sparse:
            raise RuntimeError(f"parameter {self.names[i]} has a sparse gradient, which this DDP does not support; "
                               "use a dense embedding (sparse=False) or torch's DistributedDataParallel")
        else:
            if grad.requires_grad:  # backward(create_graph=True): average the values, not the graph (as torch)
                self._warn_create_graph()
                grad = grad.detach()
            if self.as_view and grad.data_ptr() == view.data_ptr():
                if scale is not None:
                    grad.mul_(scale)
            else:
                if scale is not None:
                    torch.mul(grad, scale, out=view)
                else:
                    view.copy_(grad)
                if self.as_view:
                    self.params[i].grad = view

    def _warn_create_graph(self) -> None:
        if not self._warned_create_graph:
            self._warned_create_graph = True
            warnings.warn("DistributedDataParallel with backward(create_graph=True): gradients are averaged "
                          "across ranks, but higher-order gradients are not synchronized (as in torch's DDP)",
                          stacklevel=3)

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets) and self._pending[self._next_launch] == 0:
            self._launch(self._next_launch)
            self._next_launch += 1
        if self._next_launch == len(self.buckets) and self._used is not None:
            self._launch_used_map()

    def _launch(self, b: int) -> None:
        timing = self.timing
        if timing is not None and (b == 0 or timing.per_bucket):
            timing.bucket_launch[b] = timing.clock.stamp()
        if self.comm_hook is None:  # in place on the ProcessGroup itself, as torch's C++ reducer does
            self._futures[b] = self._group_for(b).allreduce([self.flats[b]]).get_future()
        else:
            state = self.comm_state
            if isinstance(state, RoundRobinProcessGroup):
                state = state.group_for(b)
            bucket = GradBucket(b, self.flats[b], self._bucket_views[b], self._bucket_params[b],
                                b == len(self.buckets) - 1)
            self._futures[b] = self.comm_hook(state, bucket)
        if timing is not None and timing.bucket_done is not None:
            self._futures[b].add_done_callback(timing.stamp_done(b))

    def _launch_used_map(self) -> None:
        """Allreduce the usage bitmap; only a rank with a locally unused parameter will wait for it."""
        used, self._used = self._used, bytearray(len(self.params))
        device = self.params[0].device
        host = torch.frombuffer(used, dtype=torch.uint8).to(torch.int32)
        if device.type == "cuda":  # an asynchronous copy: no host sync unless a parameter is unused here
            host = host.pin_memory()
        self._used_map = host.to(device, non_blocking=True)
        self._local_unused = 0 in used
        self._used_work = dist.all_reduce(self._used_map, group=self.primary_group, async_op=True)

    def _finalize(self) -> None:
        """Runs once autograd has finished: wait for each bucket, write its averages back to ``.grad``."""
        self.expect_hooks = False
        self._started = False
        timing = self.timing
        if timing is not None:
            timing.backward_end = timing.clock.stamp()
            if timing.backward_start is None:
                timing.backward_start = timing.backward_end
        if not self.overlap:
            self._launch_ready()
        futures, self._futures = self._futures, []  # their values hold the buckets: not kept past this iteration
        # The common case: each bucket goes back to .grad as soon as it is reduced, while later buckets are still
        # in flight. Views, unused-parameter detection and missing .grad go through _write_back at the end.
        grads = None
        if not (self.as_view or self._used is not None or self._static_skip):
            grads = [p.grad for p in self.params]
            if any(g is None for g in grads):
                grads = None
        per_bucket = timing is not None and timing.per_bucket
        if per_bucket:  # finish stamped here, not by a callback on the comm thread; on the host clock a bucket
            # already done now reads as done now, not after the write-back of the buckets before it
            done = [timing.clock.on_host and f.done() for f in futures]
            timing.comm_end = now = timing.clock.stamp()
        with torch.no_grad():  # with create_graph=True this runs in grad mode: the copies are not part of it
            for b, f in enumerate(futures):
                value = f.wait()
                if timing is not None and not per_bucket and b == len(futures) - 1:
                    timing.comm_end = timing.clock.stamp()  # the stream now waits for every reduction
                if per_bucket:
                    if done[b]:
                        timing.bucket_finish[b] = now
                    else:
                        timing.bucket_finish[b] = timing.comm_end = timing.clock.stamp()
                    if timing.bucket_done is not None and timing.bucket_done[b] is None:
                        # the completion callback runs just after the future is marked done and may not have
                        # run yet: the wait's own stamp is then the closest bound
                        timing.bucket_done[b] = timing.bucket_finish[b]
                if isinstance(value, list):  # a collective's own future: [reduced tensor]
                    value = value[0]
                if value is not self.flats[b]:
                    self.flats[b].copy_(value)
                if grads is not None:
                    torch._foreach_copy_([grads[i] for i in self.buckets[b].param_indices], self._bucket_views[b])
            if grads is None:
                unused_everywhere = set(self._static_skip)
                if self._used_work is not None:
                    self._used_work.wait()
                    if self._local_unused:  # only then is the bitmap read on the host
                        unused_everywhere = set((self._used_map == 0).nonzero().flatten().tolist())
                    self._used_work = self._used_map = None
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
