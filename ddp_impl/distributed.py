"""The module front-end: wrapping a local model is the only change a training script needs.

1. Construction checks that every rank holds the same parameters, broadcasts rank 0's parameters and buffers
   in chunks of at most 250 MiB (``init_sync``), and builds the reducer (buckets and gradient hooks).
2. A synchronized forward (grad enabled, outside ``no_sync``) first checks that the previous backward finished
   its reduction, broadcasts rank 0's current buffers (re-read from the module, so a replaced buffer is sent),
   runs the module, then arms the reducer for the coming backward; with ``find_unused_parameters`` it walks the
   autograd graph from every tensor in the output (tensors, lists, tuples, dicts, dataclasses) to find the
   parameters this iteration will give no gradient, and joins the output tensors in one autograd node, so
   that an output the loss leaves out still runs its branch (without a gradient) and cannot stall a bucket.
3. Inside ``no_sync()`` nothing is communicated: gradients accumulate in ``.grad`` and the next synchronized
   backward reduces their sum.
4. Pickling (``torch.save``, ``copy.deepcopy``) drops the process group and the reducer, and unpickling
   rebuilds them on the default group, as torch's DDP does.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Joinable

from . import autotune, join, lifetime
from .broadcast import BROADCAST_CHUNK_BYTES, broadcast_coalesced
from .buckets import mb_to_bytes
from .comm_hooks import resolve
from .construction import buffer_sync, caps_bytes, check_arguments, check_devices, sync_at_construction
from .outputs import tensors_in, through_sink, unreached_parameters
from .process_groups import RoundRobinProcessGroup
from .reducer import Reducer
from .timing import IterationTiming, clock_for


class DistributedDataParallel(lifetime.Picklable, nn.Module, join.JoinableDDP):
    """Bucketed, overlapping data parallelism with torch's DDP's API; ``ddp_impl``'s module docstrings give the
    algorithm.

    Args:
        module: the local model, the same on every rank (checked and broadcast from rank 0 at construction).
        process_group: the group to reduce over (default: the default group), or a
            :class:`RoundRobinProcessGroup` whose groups take the buckets in turn.
        bucket_cap_mb: cap of a gradient bucket in MiB, as torch's; 0 gives one bucket per parameter. Left at
            ``None``: 25 MiB, with a first bucket of 1 MiB. ``"auto"``: found during the first iterations
            (``ddp_impl.autotune``; at most 30), then :attr:`autotune_result` says which and why.
        first_bucket_cap_mb: cap of the first bucket (the first gradients ready); default 1 MiB with the default
            cap, else ``bucket_cap_mb``, as torch 2.x.
        find_unused_parameters: after each forward, walk the autograd graph from the output to find the
            parameters this iteration gives no gradient, so that their buckets do not wait for them.
        broadcast_buffers: deprecated; ``False`` stops every buffer broadcast.
        overlap: launch each bucket's allreduce as soon as it is full, during backward; ``False`` is the paper's
            non-overlapping baseline (same buckets, all reduced after backward).
        gradient_as_bucket_view: each ``.grad`` a view into its bucket, so nothing is copied back.
        rebuild_buckets: after the first iteration, rebuild the buckets in the order gradients were ready, as
            torch; ``False`` keeps the paper's static layout (reverse registration order).
        comm_hook: a torch-API hook ``(state, GradBucket) -> Future``, or the short name of one of torch's own
            (``"allreduce"``, ``"fp16"``, ``"bf16"``), registered at construction.
        timing: ``True`` records each iteration's phases in :attr:`last_timing`, ``"trace"`` each bucket's ready
            and true completion times too (a callback per bucket), ``False`` nothing; may change between iterations.
        static_graph: the same parameters are used, the same number of times, every iteration (torch's meaning):
            learned in the first iteration, it allows reentrant backwards, a parameter checkpointed twice and
            unused parameters without ``find_unused_parameters``.
        forward_sync_buffers: broadcast rank 0's buffers before each synchronized forward (default ``True``).
        init_sync: check that every rank holds the same parameters and broadcast rank 0's parameters and buffers.
        bucket_cap_mb_list: one cap per bucket instead (torch 2.14), the last repeating.
        autotune_prior_mb: with ``bucket_cap_mb="auto"``, caps ordered by predicted latency, best first (e.g. the
            suite's simulator's): its first two are raced against the default instead of a coarse-to-fine search.

    Note:
        Inside :meth:`no_sync` nothing is communicated: gradients accumulate, and the next synchronized backward
        reduces their sum. :meth:`join` trains on uneven inputs across ranks. Sparse gradients are refused.
        Every setting but the module and its group also travels as one :class:`~ddp_impl.DDPOptions`.

    Example::

        >>> dist.init_process_group("gloo")
        >>> model = DistributedDataParallel(net, bucket_cap_mb=5)
        >>> model(inputs).sum().backward()  # gradients averaged over the ranks when backward returns
        >>> options = DDPOptions(bucket_cap_mb=5, gradient_as_bucket_view=True)
        >>> model = DistributedDataParallel(net, **options.kwargs())
    """

    def __init__(
        self,
        module: nn.Module,
        process_group=None,
        bucket_cap_mb: float | str | None = None,
        first_bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool | None = None,
        overlap: bool = True,
        gradient_as_bucket_view: bool = False,
        rebuild_buckets: bool = True,
        comm_hook: Callable | str | None = None,
        timing: bool | str = True,
        static_graph: bool = False,
        forward_sync_buffers: bool | None = None,
        init_sync: bool = True,
        bucket_cap_mb_list: Sequence[float] | None = None,
        autotune_prior_mb: Sequence[float] | None = None,
    ):
        super().__init__()
        Joinable.__init__(self)  # _join_config: disabled until a Join context enables it
        tune = autotune.requested(bucket_cap_mb, first_bucket_cap_mb, bucket_cap_mb_list, comm_hook)
        cap, first_cap = caps_bytes(None if tune else bucket_cap_mb, first_bucket_cap_mb)
        comm_hook = resolve(comm_hook) if comm_hook is not None else None
        check_arguments(timing)
        self.module, self.timing = module, timing
        self.process_group = group = process_group if process_group is not None else dist.group.WORLD
        self._primary = group.primary if isinstance(group, RoundRobinProcessGroup) else group
        self.world_size = dist.get_world_size(self._primary)
        self.forward_sync_buffers, init_sync_buffers = buffer_sync(broadcast_buffers, forward_sync_buffers)
        self._torch_attributes(find_unused_parameters, static_graph, bucket_cap_mb_list)
        device = check_devices(module, dist.get_backend(self._primary))
        if init_sync:  # False: the user vouches that every rank already holds the same model (as torch)
            sync_at_construction(module, self._primary, self.world_size, device, init_sync_buffers)
        self._clock = clock_for(device)
        self._reducer_args = dict(
            cap_bytes=self.bucket_bytes_cap_list or cap,
            first_cap_bytes=first_cap,
            overlap=overlap,
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
            rebuild_buckets=rebuild_buckets,
        )
        self.reducer = self._make_reducer()
        autotune.attach(self, bucket_cap_mb, tune, autotune_prior_mb)
        self._comm_hook = None
        if comm_hook is not None:  # the default group as None, so the model stays picklable (as torch's hooks)
            self.register_comm_hook(None if self.process_group is dist.group.WORLD else self.process_group, comm_hook)
        lifetime.track(self)

    def _torch_attributes(self, find_unused_parameters: bool, static_graph: bool, caps_mb: Sequence[float] | None):
        """torch's DDP's public attributes, same meanings, and the state the forward keeps between iterations."""
        self.bucket_bytes_cap_list = [mb_to_bytes(mb) for mb in caps_mb or ()]
        self.broadcast_bucket_size = BROADCAST_CHUNK_BYTES
        self.parameters_to_ignore: set[str] = set()  # ignoring is not supported
        self.find_unused_parameters, self.static_graph = find_unused_parameters, static_graph
        self.require_backward_grad_sync = True
        self._divide_by_initial_world_size = True
        self._sync_buffers_now = True
        self._modules_now = list(self.module.modules())  # walked for buffers before each forward, see _sync_buffers

    def _make_reducer(self) -> Reducer:
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        return Reducer(
            [p for _, p in named], [n for n, _ in named], self.process_group, self.world_size, **self._reducer_args
        )

    # ---- public API -----------------------------------------------------------------------------------
    @property
    def broadcast_buffers(self) -> bool:
        """torch's deprecated name of ``forward_sync_buffers``."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after leaving reduces the accumulated sum.

        Example::

            >>> with model.no_sync():
            ...     model(first).sum().backward()  # nothing communicated
            >>> model(second).sum().backward()  # reduces the sum of both iterations' gradients
        """
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Reduce each bucket with ``hook`` from now on (torch's API); once per model, as in torch.

        Args:
            state: passed to every call of the hook; a :class:`RoundRobinProcessGroup` is resolved to each
                bucket's group.
            hook: ``hook(state, bucket: GradBucket) -> Future[Tensor]``, e.g. torch's
                ``default_hooks.fp16_compress_hook`` or ``powerSGD_hook.powerSGD_hook``, or a short name
                (``"allreduce"``, ``"fp16"``, ``"bf16"``).

        Note:
            The bucket's buffer is not divided by the world size before the hook: the hook averages.

        Example::

            >>> from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            >>> model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        """
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook can only be called once per DistributedDataParallel model")
        hook = resolve(hook)
        if self._tuner is not None:
            autotune.refuse_untunable(None, None, hook)
        self._comm_hook = (hook, state)
        self.reducer.comm_hook, self.reducer.comm_state = hook, state

    def _sync_buffers(self, joined: bool = False) -> None:
        """Before a forward that follows a synchronized one, every rank takes one rank's buffers: rank 0's, or
        in a join context the highest rank still training (a joined rank's buffers are stale)."""
        if not (self._sync_buffers_now and self.forward_sync_buffers and self.world_size > 1):
            return
        buffers = self._current_buffers()
        if buffers:
            src = join.common_rank(self, not joined) if self._join_config.enable else 0
            broadcast_coalesced(buffers, self._primary, src)

    def _current_buffers(self) -> list[torch.Tensor]:
        """The module's buffers as they are now (one may have been replaced or registered since the last forward),
        read from the modules it had at construction (torch's DDP keeps the buffers themselves): ``module.buffers()``
        walks the tree with names, 0.42 ms before every forward for 400 layers on this CPU against 0.05 ms here."""
        found = {id(b): b for m in self._modules_now for b in m._buffers.values() if b is not None}
        return [b.detach() for b in found.values()]

    @property
    def last_timing(self) -> IterationTiming | None:
        """Stamps of the last synchronized iteration (``.as_dict()`` for milliseconds)."""
        return self.reducer.last_timing

    def bucket_info(self) -> list[dict]:
        """The current bucket mapping: index, parameter names, element count, bytes."""
        return [b.as_dict() for b in self.reducer.buckets]

    def forward(self, *args, **kwargs):
        reducer = self.reducer
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if sync:
            reducer.check_prior_finished()
        if self._join_config.enable:
            join.announce(self, sync)
        if sync:
            reducer.rebuild_if_pending()
            if self._tuner is not None:
                autotune.step(self)
        timing = (
            IterationTiming(self._clock, len(reducer.buckets), trace=self.timing == "trace")
            if sync and self.timing
            else None
        )
        self._sync_buffers()  # as torch's DDP: iff the previous forward was synchronized
        self._sync_buffers_now = sync
        output = self.module(*args, **kwargs)
        if sync:
            if timing is not None:
                timing.forward_end = self._clock.stamp()
            tensors = (
                [t for t in tensors_in(output) if t.requires_grad]
                if timing is not None or self.find_unused_parameters
                else []
            )
            unused = []
            if self.find_unused_parameters and not self.static_graph:  # a static graph's reducer knows already
                with torch.autograd.profiler.record_function("search_unused_parameters"):  # torch's name
                    unused = unreached_parameters(tensors, self.reducer.params)
                if len(tensors) > 1:
                    output, tensors = through_sink(output, tensors)
            if timing is not None:
                for t in tensors:
                    t.register_hook(lambda grad: _stamp_backward_start(timing))
            reducer.prepare_for_backward(timing, unused)
        return output


def _stamp_backward_start(timing: IterationTiming) -> None:
    if timing.backward_start is None:
        timing.backward_start = timing.clock.stamp()
