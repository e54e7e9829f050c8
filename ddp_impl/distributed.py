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

import warnings
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable

from . import join, lifetime
from .broadcast import BROADCAST_CHUNK_BYTES, broadcast_coalesced
from .buckets import mb_to_bytes
from .comm_hooks import resolve
from .outputs import tensors_in, through_sink
from .process_groups import RoundRobinProcessGroup
from .reducer import Reducer
from .timing import IterationTiming, clock_for

DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_CAP_MB = 1  # torch's _DEFAULT_FIRST_BUCKET_BYTES, used only with the default cap


class DistributedDataParallel(nn.Module, Joinable):
    """Bucketed, overlapping data parallelism; see the module docstrings of ``ddp_impl`` for the algorithm.

    ``bucket_cap_mb`` and ``first_bucket_cap_mb`` are MiB like torch's; 0 gives one bucket per parameter. As in
    torch (2.x), the first bucket is capped at 1 MiB only when ``bucket_cap_mb`` is left at its default (25);
    an explicit ``bucket_cap_mb`` caps the first bucket too, unless ``first_bucket_cap_mb`` is given.
    ``bucket_cap_mb_list`` (torch 2.14) gives one cap per bucket instead, the last repeating; those buckets are
    filled in registration order in the first iteration and rebuilt in gradient order, as torch does.
    ``overlap=False`` is the paper's non-overlapping baseline (same buckets, all reduced after backward).
    ``rebuild_buckets=False`` keeps the paper's static layout (reverse registration order) instead of torch's
    (one bucket in the first iteration, then rebuilt in the observed gradient order).
    ``comm_hook`` registers a torch-API hook at construction: a callable ``(state, GradBucket) -> Future`` or a
    short name of one of torch's own (``"allreduce"``, ``"fp16"``, ``"bf16"``); ``register_comm_hook`` takes
    any state. ``process_group`` may be a :class:`RoundRobinProcessGroup`. ``timing=False`` turns the
    per-iteration instrumentation off (``last_timing`` is then ``None``), ``timing="trace"`` adds each bucket's
    ready and true completion times (a callback per bucket); the attribute may be flipped between iterations.
    ``static_graph=True`` (torch's meaning: the same parameters are used, the same number of times, every
    iteration) learns in the first iteration how many gradient hooks each parameter fires and which
    never fire; later iterations need no graph search and allow reentrant backwards, a parameter checkpointed
    twice, and unused parameters without ``find_unused_parameters``. Buffers follow torch 2.14:
    ``forward_sync_buffers`` (default True) broadcasts rank 0's buffers before each synchronized forward; they
    are always broadcast at construction unless ``init_sync=False`` (which skips the parameter check and
    broadcast too) or the deprecated ``broadcast_buffers=False`` is given.
    ``join()`` trains on uneven inputs across ranks, as torch's (see ``ddp_impl.join``). Not supported, with a
    clear error: sparse gradients.
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = None,
                 first_bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 broadcast_buffers: bool | None = None, overlap: bool = True, gradient_as_bucket_view: bool = False,
                 rebuild_buckets: bool = True, comm_hook: Callable | str | None = None, timing: bool | str = True,
                 static_graph: bool = False, forward_sync_buffers: bool | None = None, init_sync: bool = True,
                 bucket_cap_mb_list: Sequence[float] | None = None):
        super().__init__()
        Joinable.__init__(self)  # _join_config: disabled until a Join context enables it
        self._divide_by_initial_world_size = True
        if first_bucket_cap_mb is None:
            first_bucket_cap_mb = DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        if bucket_cap_mb is None:
            bucket_cap_mb = DEFAULT_BUCKET_CAP_MB
        cap, first_cap = mb_to_bytes(bucket_cap_mb), mb_to_bytes(first_bucket_cap_mb)
        self.bucket_bytes_cap_list = [mb_to_bytes(mb) for mb in bucket_cap_mb_list or ()]  # torch's attribute
        if self.bucket_bytes_cap_list:
            cap = self.bucket_bytes_cap_list
        if comm_hook is not None:
            comm_hook = resolve(comm_hook)
        if timing not in (True, False, "trace"):
            raise ValueError(f"timing must be True, False or 'trace', got {timing!r}")
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ddp_impl.DistributedDataParallel needs an initialized process group: call "
                               "torch.distributed.init_process_group(...) first")
        self.module = module
        group = process_group if process_group is not None else dist.group.WORLD
        primary = group.primary if isinstance(group, RoundRobinProcessGroup) else group
        self.process_group, self._primary = group, primary
        self.world_size = dist.get_world_size(primary)
        self.forward_sync_buffers, init_sync_buffers = _buffer_sync(broadcast_buffers, forward_sync_buffers)
        self.broadcast_bucket_size = BROADCAST_CHUNK_BYTES  # torch's public attribute, same meaning
        self.parameters_to_ignore: set[str] = set()  # torch's public attribute; ignoring is not supported
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self._sync_buffers_now = True
        self.timing = timing
        self._modules_now = list(module.modules())  # walked for buffers before each forward, see _sync_buffers

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                               "that requires a gradient: there is nothing to reduce")
        device = self._check_devices(named, dist.get_backend(primary))
        if init_sync:  # False: the user vouches that every rank already holds the same model (as torch)
            with _current_device(device):  # object collectives run on the current CUDA device
                self._verify_same_parameters(module)
        if init_sync and self.world_size > 1:
            states = [p.detach() for p in module.parameters()]
            if init_sync_buffers:
                states += [b.detach() for b in module.buffers()]
            broadcast_coalesced(states, primary)
        self._clock = clock_for(device)
        self._reducer_args = dict(cap_bytes=cap, first_cap_bytes=first_cap, overlap=overlap,
                                  find_unused_parameters=find_unused_parameters, static_graph=static_graph,
                                  gradient_as_bucket_view=gradient_as_bucket_view, rebuild_buckets=rebuild_buckets)
        self.reducer = self._make_reducer()
        self._comm_hook = None
        if comm_hook is not None:  # the default group as None, so the model stays picklable (as torch's hooks)
            self.register_comm_hook(None if group is dist.group.WORLD else group, comm_hook)
        lifetime.track(self)

    def _make_reducer(self) -> Reducer:
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        return Reducer([p for _, p in named], [n for n, _ in named], self.process_group, self.world_size,
                       **self._reducer_args)

    @staticmethod
    def _check_devices(named, backend: str) -> torch.device:
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise ValueError(f"parameters span devices {sorted(map(str, devices))}; use one device per process")
        device = next(iter(devices))
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(f"the NCCL backend needs CUDA tensors, but parameter {named[0][0]} is on {device}; "
                             "move the module to its GPU first (module.to(f'cuda:{local_rank}')) or use Gloo")
        return device

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
    @property
    def broadcast_buffers(self) -> bool:
        """torch's deprecated name of ``forward_sync_buffers``."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after leaving reduces the accumulated sum."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """torch's API: ``hook(state, bucket: GradBucket) -> Future[Tensor]`` reduces each bucket from now on,
        e.g. ``default_hooks.fp16_compress_hook`` or ``powerSGD_hook.powerSGD_hook``. The buffer is not divided
        by the world size: the hook averages. A :class:`RoundRobinProcessGroup` as ``state`` is resolved to each
        bucket's group. Once per model, as in torch."""
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook can only be called once per DistributedDataParallel model")
        hook = resolve(hook)
        self._comm_hook = (hook, state)
        self.reducer.comm_hook, self.reducer.comm_state = hook, state

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """torch's API: a context in which ranks may run different numbers of iterations (``ddp_impl.join``).
        Inside it every forward costs two small extra allreduces; ``enable=False`` makes it a no-op."""
        if enable and self.static_graph and self.reducer.static_graph_pending:
            raise RuntimeError("join() with static_graph=True needs one synchronized iteration on every rank "
                               "before the join context (the first iteration learns the graph)")
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs) -> join.DDPJoinHook:
        """Joinable's API: what a joined rank runs while others still train (``Join([model, optimizer])``)."""
        return join.DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.reducer.params[0].device

    @property
    def join_process_group(self):
        return self._primary

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
        timing = IterationTiming(self._clock, len(reducer.buckets), trace=self.timing == "trace") \
            if sync and self.timing else None
        self._sync_buffers()  # as torch's DDP: iff the previous forward was synchronized
        self._sync_buffers_now = sync
        output = self.module(*args, **kwargs)
        if sync:
            if timing is not None:
                timing.forward_end = self._clock.stamp()
            tensors = [t for t in tensors_in(output) if t.requires_grad] \
                if timing is not None or self.find_unused_parameters else []
            unused = []
            if self.find_unused_parameters and not self.static_graph:  # a static graph's reducer knows already
                with torch.autograd.profiler.record_function("search_unused_parameters"):  # torch's name
                    unused = self._unused_parameters(tensors)
                if len(tensors) > 1:
                    output, tensors = through_sink(output, tensors)
            if timing is not None:
                for t in tensors:
                    t.register_hook(lambda grad: _stamp_backward_start(timing))
            reducer.prepare_for_backward(timing, unused)
        return output

    def _unused_parameters(self, outputs: list[torch.Tensor]) -> list[int]:
        """Parameters the autograd graph of ``outputs`` does not reach: they will get no gradient."""
        reached, seen = set(), set()
        stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
        reached.update(id(t) for t in outputs if t.grad_fn is None)  # an output that is a parameter itself
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

    # ---- pickling (torch.save, copy.deepcopy), as torch's DDP --------------------------------------------
    def __getstate__(self):
        if self.process_group is not dist.group.WORLD:
            raise RuntimeError("pickling DistributedDataParallel (torch.save, copy.deepcopy) is only supported "
                               "with the default process group, as in torch: save model.module instead")
        state = dict(self.__dict__)
        for key in ("process_group", "_primary", "reducer", "_join_flag"):
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.process_group = self._primary = dist.group.WORLD
        self.reducer = self._make_reducer()
        if self._comm_hook is not None:
            self.reducer.comm_hook, self.reducer.comm_state = self._comm_hook
        lifetime.track(self)

    def release_groups(self) -> None:
        """Drop every reference this DDP holds to a process group, so that destroying the groups frees them
        (``ddp_impl.lifetime``, at exit); it cannot communicate afterwards."""
        self.process_group = self._primary = None
        self.__dict__.pop("_join_flag", None)  # a join context's pending allreduce
        reducer = getattr(self, "reducer", None)
        if reducer is not None:
            reducer.group = reducer.comm_state = reducer._used_work = None
            reducer._futures, reducer._bucket_groups = [], []
        if self._comm_hook is not None:
            self._comm_hook = (self._comm_hook[0], None)


def _buffer_sync(broadcast_buffers: bool | None, forward_sync_buffers: bool | None) -> tuple[bool, bool]:
    """(sync buffers before each forward, sync them at construction), as torch 2.14 resolves its arguments:
    ``forward_sync_buffers`` wins and leaves the construction sync on; the deprecated ``broadcast_buffers``
    governs both, with torch's FutureWarning."""
    if broadcast_buffers is not None:
        warnings.warn("`broadcast_buffers` is deprecated (as in torch 2.14): use `forward_sync_buffers`, which does "
                      "not stop the buffer broadcast at construction; "
                      + ("it wins over `broadcast_buffers`, whose value is ignored" if forward_sync_buffers is not None
                         else "keep `broadcast_buffers=False` where rank-local buffers must survive construction"),
                      FutureWarning, stacklevel=3)
    if forward_sync_buffers is not None:
        return forward_sync_buffers, True
    sync = True if broadcast_buffers is None else broadcast_buffers
    return sync, sync


def _stamp_backward_start(timing: IterationTiming) -> None:
    if timing.backward_start is None:
        timing.backward_start = timing.clock.stamp()


def _current_device(device: torch.device):
    """On CUDA, make ``device`` current (object collectives and NCCL use the current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
