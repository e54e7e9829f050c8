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

import copy
import dataclasses
import warnings
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .buckets import MIB, mb_to_bytes
from .comm_hooks import resolve
from .process_groups import RoundRobinProcessGroup
from .reducer import Reducer
from .timing import IterationTiming, clock_for

DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_CAP_MB = 1  # torch's _DEFAULT_FIRST_BUCKET_BYTES, used only with the default cap
BROADCAST_CHUNK_BYTES = 250 * MIB  # torch's broadcast_bucket_size: bounds the extra memory of the broadcast


class DistributedDataParallel(nn.Module):
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
    Not supported, with a clear error: ``join`` (uneven inputs), sparse gradients.
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float | None = None,
                 first_bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 broadcast_buffers: bool | None = None, overlap: bool = True, gradient_as_bucket_view: bool = False,
                 rebuild_buckets: bool = True, comm_hook: Callable | str | None = None, timing: bool | str = True,
                 static_graph: bool = False, forward_sync_buffers: bool | None = None, init_sync: bool = True,
                 bucket_cap_mb_list: Sequence[float] | None = None):
        super().__init__()
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
            _broadcast_coalesced(states, primary)
        self._clock = clock_for(device)
        self._reducer_args = dict(cap_bytes=cap, first_cap_bytes=first_cap, overlap=overlap,
                                  find_unused_parameters=find_unused_parameters, static_graph=static_graph,
                                  gradient_as_bucket_view=gradient_as_bucket_view, rebuild_buckets=rebuild_buckets)
        self.reducer = self._make_reducer()
        self._comm_hook = None
        if comm_hook is not None:  # the default group as None, so the model stays picklable (as torch's hooks)
            self.register_comm_hook(None if group is dist.group.WORLD else group, comm_hook)

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

    def join(self, *args, **kwargs):
        raise NotImplementedError(
            "join() (uneven inputs across ranks) is not supported by ddp_impl: give every rank the same number of "
            "batches (e.g. DistributedSampler(..., drop_last=True)), or use torch's DistributedDataParallel")

    join_hook = join  # torch.distributed.algorithms.Join([model]) asks for this: the same clear error

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
            reducer.rebuild_if_pending()
        timing = IterationTiming(self._clock, len(reducer.buckets), trace=self.timing == "trace") \
            if sync and self.timing else None
        if self._sync_buffers_now and self.forward_sync_buffers and self.world_size > 1:
            buffers = [b.detach() for b in self.module.buffers()]  # re-read: a buffer may have been replaced
            if buffers:
                _broadcast_coalesced(buffers, self._primary)
        # Like torch's DDP: buffers are broadcast before a forward iff the previous forward was synchronized.
        self._sync_buffers_now = sync
        output = self.module(*args, **kwargs)
        if sync:
            if timing is not None:
                timing.forward_end = self._clock.stamp()
            tensors = [t for t in _tensors_in(output) if t.requires_grad] \
                if timing is not None or self.find_unused_parameters else []
            unused = []
            if self.find_unused_parameters and not self.static_graph:  # a static graph's reducer knows already
                with torch.autograd.profiler.record_function("search_unused_parameters"):  # torch's name
                    unused = self._unused_parameters(tensors)
                if len(tensors) > 1:
                    output, tensors = _joined(output, tensors)
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
        for key in ("process_group", "_primary", "reducer"):
            del state[key]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.process_group = self._primary = dist.group.WORLD
        self.reducer = self._make_reducer()
        if self._comm_hook is not None:
            self.reducer.comm_hook, self.reducer.comm_state = self._comm_hook


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


def _tensors_in(obj) -> Iterator[torch.Tensor]:
    """Every tensor in a nested output, as torch's DDP finds them: tensors, lists, tuples (named too), dicts
    (a transformers ModelOutput is one) and dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors_in(getattr(obj, f.name))


class _JoinOutputs(torch.autograd.Function):
    """Every output tensor through one node (torch's ``_DDPSink``): a backward from any of them then runs the
    branches of the others too, with no gradient (``None``, not zeros), so the hooks of parameters behind an
    output the loss left out still fire and the reducer counts those parameters unused on this rank instead of
    waiting for gradients that never come."""

    @staticmethod
    def forward(ctx, *tensors):
        ctx.set_materialize_grads(False)
        return tuple(t.clone() for t in tensors)  # clones, so the caller may modify an output in place

    @staticmethod
    def backward(ctx, *grads):
        return grads


def _joined(output, tensors: list[torch.Tensor]):
    """``output`` with each of ``tensors`` replaced by its pass through one :class:`_JoinOutputs` node, and the
    new tensors."""
    joined = _JoinOutputs.apply(*tensors)
    new = {id(t): j for t, j in zip(tensors, joined)}
    return _with_tensors(output, new), list(joined)


def _with_tensors(obj, new: dict[int, torch.Tensor]):
    """A copy of a nested output with tensors replaced through ``new`` (by ``id``), walking what ``_tensors_in``
    walks; containers are rebuilt as the same type (a frozen dataclass too), anything else kept as is."""
    if isinstance(obj, torch.Tensor):
        return new.get(id(obj), obj)
    if isinstance(obj, dict):
        copy_ = copy.copy(obj)  # keeps the type (a transformers ModelOutput, a defaultdict's factory)
        for k, v in obj.items():
            copy_[k] = _with_tensors(v, new)
        return copy_
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple
        return type(obj)(*(_with_tensors(v, new) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_with_tensors(v, new) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        copy_ = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(copy_, f.name, _with_tensors(getattr(obj, f.name), new))
        return copy_
    return obj


def _current_device(device: torch.device):
    """On CUDA, make ``device`` current (object collectives and NCCL use the current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


@torch.no_grad()
def _broadcast_coalesced(tensors: list[torch.Tensor], group, chunk_bytes: int = BROADCAST_CHUNK_BYTES) -> None:
    """Broadcast rank 0's tensors with one collective per chunk of one (device, dtype) instead of one per tensor.

    A chunk holds at most ``chunk_bytes`` (or one tensor, if bigger), so the extra memory is bounded, as torch's
    250 MiB broadcast buckets. Up to two chunks are in flight: one is copied out while the next is on the wire.
    """
    src = dist.get_global_rank(group, 0)
    is_source = dist.get_rank() == src
    chunks: list[list[torch.Tensor]] = []
    kinds: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.device, t.dtype), []).append(t)
    for same in kinds.values():
        chunk, size = [], 0
        for t in same:
            if chunk and size + t.numel() * t.element_size() > chunk_bytes:
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(t)
            size += t.numel() * t.element_size()
        chunks.append(chunk)

    def start(chunk):
        flat = torch.cat([t.reshape(-1) for t in chunk])
        return flat, dist.broadcast(flat, src=src, group=group, async_op=True)

    in_flight = start(chunks[0]) if chunks else None
    for k, chunk in enumerate(chunks):
        flat, work = in_flight
        in_flight = start(chunks[k + 1]) if k + 1 < len(chunks) else None
        work.wait()
        if not is_source:
            torch._foreach_copy_(chunk, [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in chunk]), chunk)])
