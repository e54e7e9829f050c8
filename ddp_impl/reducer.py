"""The reducer: gradient hooks, bucket readiness, in-order launch, and finalize.

1. Each parameter's gradient accumulator gets a hook. When its gradient is final for this backward, the hook
   counts it against its bucket, and copies it into its slice of the bucket's flat tensor if it is large
   (divided by the world size unless a comm hook is registered: then averaging is the hook's job, as in torch).
2. When a bucket's last gradient is final, its small gradients are copied and divided in one fused copy and
   one fused multiply (a kernel per tiny gradient would cost host time the C++ reducer does not pay), and the
   bucket is ready. Ready buckets are launched (``bucket_launch``) strictly in bucket-index order, so every
   rank issues the same collectives in the same order even if gradients arrive in a different order. A bucket
   of one gradient is averaged and reduced in that ``.grad`` itself, with nothing to copy in or back (``_ready_hot``).
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

import weakref
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.autograd.graph import get_gradient_edge

from .bucket_launch import SUM, BucketLaunch
from .bucket_store import EAGER_COPY_NUMEL, BucketStore
from .buckets import ParamSpec, assign_buckets, initial_buckets
from .timing import IterationTiming
from .write_back import WriteBack


def hook_accumulators(params: Sequence[torch.Tensor], make_hook: Callable[[int], Callable]) -> tuple[list, list]:
    """``make_hook(i)`` on parameter i's gradient accumulator, as torch's reducer hooks it: it runs once the incoming
    gradient is accumulated and freed, the moment DDP's buckets see a gradient ready. A post-accumulate-grad hook on
    the parameter runs while that temporary is alive, which leaves glibc trimming and re-faulting the heap under
    large gradients (BERT-base's 9 MiB). Returns (accumulators, handles): hold the
    accumulators, or autograd builds new ones and the hooks never run."""
    with torch.enable_grad():
        accumulators = [get_gradient_edge(p).node for p in params]
    return accumulators, [acc.register_hook(make_hook(i)) for i, acc in enumerate(accumulators)]


class Reducer(BucketStore, BucketLaunch, WriteBack):
    _hot_armed = False  # _hot, and a hook of this backward has run: the hook goes straight to _ready_hot

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        group,
        world_size: int,
        cap_bytes: int | list[int],
        first_cap_bytes: int,
        overlap: bool,
        find_unused_parameters: bool,
        gradient_as_bucket_view: bool,
        rebuild_buckets: bool,
        static_graph: bool = False,
    ):
        self.params = list(params)
        self.names = list(names)
        self.group = group
        self.world_size = world_size
        self._set_scale(1.0 / world_size)  # multiply, not divide: bitwise the same averages as torch's reducer
        self.cap_bytes, self.first_cap_bytes = cap_bytes, first_cap_bytes
        self.comm_hook: Callable | None = None  # torch's hook API; None: our own averaging allreduce
        self.comm_state = None
        self.overlap = overlap
        if static_graph:  # the first iteration finds the unused parameters once and for all
            find_unused_parameters = False
        self.find_unused = find_unused_parameters
        self._static_state(static_graph)
        self.as_view = gradient_as_bucket_view
        rebuild = rebuild_buckets and not find_unused_parameters  # torch never rebuilds with find_unused
        self.rebuild_pending = rebuild  # rebuilt once, after the first synchronized iteration
        self.specs = [ParamSpec.of(n, p) for n, p in zip(self.names, self.params)]
        self._eager = [s.numel >= EAGER_COPY_NUMEL for s in self.specs]
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

    def _static_state(self, static_graph: bool) -> None:
        self.static = static_graph
        self._expected: list[int] | None = None  # static graph: hooks per parameter per backward, once learnt
        self._static_skip: set[int] = set()  # static graph: parameters unused on every rank
        self._static_unused: list[int] = []  # static graph: parameters unused on this rank

    # ---- per iteration --------------------------------------------------------------------------------
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
        self._sent = list(self.flats)  # per bucket, the tensor reduced: its flat, or (_ready_hot) its one .grad
        # no usage, hook counts or gradient order to record: a hook after the first only readies its gradient
        self._plain = not self.static and self._used is None and self._order is None
        # and nothing but our allreduce per bucket, launched as soon as it can be: _ready_hot does it all inline
        self._hot = (
            self._plain
            and self.comm_hook is None
            and self.overlap
            and not self.as_view
            and (timing is None or timing.bucket_ready is None)
        )
        if self.static:  # the reducer knows the unused parameters itself once the first backward has run
            self._fired = [0] * len(self.params)
            self._unused = self._static_unused
        self._hot_armed = False

    def _make_hook(self, i: int):
        # The hook reaches the reducer through a weak reference: a strong one would make a cycle through the
        # parameter that Python's collector cannot see, keeping every DDP ever built in the process alive.
        reducer = weakref.ref(self)

        def hook(grad_inputs, grad_outputs) -> None:
            self = reducer()
            if self is None:
                return
            if self._hot_armed:  # most gradients: nothing to record, straight to the bucket
                self._ready_hot(i)
            elif self.expect_hooks:
                if self._started and self._plain:
                    self._mark_ready(i)
                else:
                    self._grad_ready(i)
            elif self._used is not None:
                self._used[i] = 1  # a no_sync backward: its usage counts at the next synchronized one

        return hook

    def _grad_ready(self, i: int) -> None:
        learning = self.static and self._expected is None  # a static graph's first backward
        if not self._started:
            self._started = True
            self._hot_armed = self._hot
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
        ready = self._ready
        if ready[i]:
            raise RuntimeError(
                f"parameter {self.names[i]} received its gradient twice in one backward, or it was taken as unused "
                "by find_unused_parameters (no tensor of the forward's output reaches it: is the output a type "
                "whose tensors cannot be found, or is the parameter behind reentrant checkpointing?); this DDP "
                "supports one backward per forward and no parameter used by two separate backward passes"
            )
        ready[i] = True
        if self._eager[i]:  # large: copied now, while backward computes the rest
            self._fill_one(i, self.params[i].grad, self._scale if self.comm_hook is None else None)
        b = self.bucket_of[i]
        left = self._pending[b] - 1
        self._pending[b] = left
        if left:
            return
        self._fill(b)
        timing = self.timing
        if timing is not None and timing.bucket_ready is not None:
            timing.bucket_ready[b] = timing.clock.stamp()
        self._buckets_left -= 1
        if self.overlap and b == self._next_launch:  # a bucket ready before those ahead of it waits for them
            self._launch_ready()
        if not self._buckets_left and not self._finalize_inline:  # on the backward running now, which
            Variable._execution_engine.queue_callback(self._finalize)  # may be a reentrant one

    def _ready_hot(self, i: int) -> None:
        """:meth:`_mark_ready` for the common case (``_hot``: only readiness to track, our allreduce, overlap, no
        trace, ``.grad`` not a view), inline: per bucket what any Python caller pays (a multiply, the allreduce's
        launch) and the count of what is ready. On a fast GPU the host's time per bucket is the iteration's (``make
        bucket-cost``). A bucket of one gradient is averaged and reduced in that ``.grad`` itself, as a bucket view
        would be: the same multiply and sum, and no copy into the bucket and back."""
        ready = self._ready
        if ready[i]:
            self._mark_ready(i)  # raises
        ready[i] = True
        b = self.bucket_of[i]
        if self._single[b]:
            grad = self.params[i].grad
            if grad is not None and not (grad.requires_grad or grad.is_sparse) and grad.is_contiguous():
                grad.mul_(self._param_factors[i])
                self._sent[b] = grad
            else:  # no gradient, a sparse one, create_graph, a layout not the bucket's: the rarer cases
                self._fill_one(i, grad, self._scale)
            self._pending[b] = 0
        else:
            if self._eager[i] or self._alone[i]:  # large, or its bucket's only small gradient: one multiply, now
                grad = self.params[i].grad
                try:
                    torch.mul(grad, self._param_factors[i], out=self.views[i])
                except (TypeError, RuntimeError):  # no gradient, a sparse one, create_graph: the rarer cases
                    self._fill_one(i, grad, self._scale)
            left = self._pending[b] - 1
            self._pending[b] = left
            if left:
                return
            if len(self._deferred[b]) > 1:  # its small gradients, in one fused copy
                self._fill(b)
        self._buckets_left -= 1
        if b == self._next_launch:  # launch it and every ready one after it, in order
            pending, last, timing, sent = self._pending, len(self._pending), self.timing, self._sent
            while True:
                if timing is not None and (b == 0 or timing.per_bucket):
                    timing.bucket_launch[b] = timing.clock.stamp()
                self._futures[b] = self._bucket_groups[b].allreduce([sent[b]], SUM)
                b += 1
                if b == last or pending[b]:
                    break
            self._next_launch = b
        if not self._buckets_left:
            Variable._execution_engine.queue_callback(self._finalize)

    @property
    def static_graph_pending(self) -> bool:
        return self.static and self._expected is None

    def remove_hooks(self) -> None:
        for h in self._hook_handles:
            h.remove()
