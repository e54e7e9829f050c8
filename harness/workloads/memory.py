"""Memory per rank over one training iteration, by category, and the bytes a rank sends: what ``make zero``
compares between data-parallel systems.

Categories come from ``torch.profiler``'s memory profile (``profile_memory``, ``record_shapes``, ``with_stack``),
which labels every tensor it sees as a parameter, gradient, optimizer state, activation (its ACTIVATION,
TEMPORARY, INPUT and AUTOGRAD_DETAIL together) or leaves it unlabelled. Of the unlabelled ones, tensors that a
collective (a ``c10d::`` op) reads or writes are counted as **communication buffers** (DDP's buckets, FSDP's
all-gathered parameters and reduce-scatter inputs); the rest is **other**. The profile is read through
``torch.profiler._memory_profiler`` (private: the public ``export_memory_timeline`` plots CUDA devices only and
drops which tensors collectives touched).

The categories are checked against an independent measure of the same iteration's peak: on GPU
``torch.cuda.max_memory_allocated``; on CPU the rise of the process's resident-set high-water mark (VmHWM,
reset through ``/proc/self/clear_refs``, less the file-backed pages: code) over its size before the model
existed, with glibc told to return every freed large block at once (``mallopt``), so freed tensors leave the
resident set. Allocations on threads other than the profiler's are not reported to it (torch's allocator looks
the profiler up per thread), so ``threads`` (replicas on worker threads) reads a few percent low.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.launch.allocator import trim_heap

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "communication_buffers", "other")
_PROFILER_CATEGORY = {
    "PARAMETER": "parameters",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activations",
    "TEMPORARY": "activations",
    "INPUT": "activations",
    "AUTOGRAD_DETAIL": "activations",
}
os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # else kineto logs a false GPU error on every CPU-only rank
TIMELINE_POINTS = 200  # samples of the timeline kept per rank (the profile has one per allocation)


@dataclass
class MemoryProfile:
    """One iteration's memory on one rank: each category at the moment the total peaked, before forward, and
    over time (ms from the iteration's start, bytes)."""

    at_peak: dict[str, int]
    at_start: dict[str, int]
    timeline: list[tuple[float, dict[str, int]]]

    @property
    def peak(self) -> int:
        return sum(self.at_peak.values())


def profiled(fn, known: dict[str, list[torch.Tensor]] | None = None) -> tuple[object, MemoryProfile]:
    """Run ``fn()`` under the memory profiler; return its result and the :class:`MemoryProfile`. ``known``: the
    system's own tensors by category (:func:`harness.workloads.systems.state_tensors`), which label the storages the
    profiler leaves unlabelled (FSDP's sharded parameters, DeepSpeed's flat partitions)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    existing = live_storage_bytes()
    with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        out = fn()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    storages = {
        t.untyped_storage().data_ptr(): (c, t.untyped_storage().nbytes())
        for c, ts in (known or {}).items()
        for t in ts
        if t.numel() and t.device == device
    }
    try:
        mp = prof._memory_profile()
    except AssertionError:  # its data-flow checks trip on some collectives and FSDP2's autograd (1 in ~5 here)
        with _without_data_flow_checks():
            mp = prof._memory_profile()
    return out, categorize(mp, device, storages, existing)


def live_storage_bytes() -> dict[int, int]:
    """Every storage a live Python tensor holds (a DTensor's shard is a tensor of its own): address -> bytes."""
    import gc

    out = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and not obj.is_meta and obj.layout == torch.strided:
            with contextlib.suppress(RuntimeError, NotImplementedError):  # wrapper subclasses have no storage
                storage = obj.untyped_storage()
                out[storage.data_ptr()] = storage.nbytes()
    out.pop(0, None)
    return out


@contextlib.contextmanager
def _without_data_flow_checks():
    """torch's memory profile with the consistency checks of its data-flow graph left out (versions are still
    bumped as it does); only used when a check fails, and the measured peak shows whether the result holds."""
    from torch.profiler import _memory_profiler as mpr

    original, validate = mpr.DataFlowNode.__init__, mpr.DataFlowGraph.validate

    def init(self, event, graph) -> None:
        self._event, self._graph = event, graph
        self._edges = self._determine_edges()
        for key, edge in self._edges.items():
            if edge.mutated and not edge.is_allocation:
                graph.bump(key)

    mpr.DataFlowNode.__init__, mpr.DataFlowGraph.validate = init, lambda self: None
    try:
        yield
    finally:
        mpr.DataFlowNode.__init__, mpr.DataFlowGraph.validate = original, validate


def _collective_keys(mp) -> set:
    """The tensors a ``c10d::`` op (any collective, on any backend) took as input or output."""
    from torch._C._profiler import _EventType, _TensorMetadata
    from torch.profiler._memory_profiler import TensorKey

    keys = set()
    for node in mp._op_tree.dfs():
        if node.typed[0] != _EventType.TorchOp or not node.name.startswith("c10d"):
            continue
        for arg in node.typed[1].inputs:
            for t in arg if isinstance(arg, list) else [arg]:
                if isinstance(t, _TensorMetadata) and (key := TensorKey.from_tensor(t)) is not None:
                    keys.add(key)
    return keys


def categorize(
    mp, device: torch.device, known: dict[int, tuple[str, int]] | None = None, existing: dict[int, int] | None = None
) -> MemoryProfile:
    """Walk the profile's timeline on ``device``: running bytes per category, its peak and a sampled series.
    ``known`` (storage address -> (category, bytes)): the system's own tensors, which name what the profiler
    leaves unlabelled and, where no op touched them in the iteration (so the profiler never saw them), are
    counted as present throughout. ``existing`` (address -> bytes, :func:`live_storage_bytes` before the
    profile): the true size of storages that predate it, which the profiler knows only from the views ops took
    of them (a flat buffer seen through one parameter's view counts as that view)."""
    from torch.profiler._memory_profiler import Action, TensorKey

    comm, known = _collective_keys(mp), known or {}

    def label(key, version) -> str:
        category = mp._categories.get(key, version) if isinstance(key, TensorKey) else None
        if category is not None:
            return _PROFILER_CATEGORY.get(category.name, "other")
        if isinstance(key, TensorKey) and key.storage.ptr in known:
            return known[key.storage.ptr][0]
        return "communication_buffers" if key in comm else "other"

    sizes, true_size = _untold_by_timeline(mp, known, existing)
    at_peak, at_start = dict(sizes), None
    series: list[tuple[int, dict[str, int]]] = []
    t0 = None
    for t, action, (key, version), nbytes in mp.timeline:
        if key.device != device:
            continue
        name, nbytes = label(key, version), true_size.get(key, nbytes)
        if action in (Action.PREEXISTING, Action.CREATE):
            sizes[name] += nbytes
        elif action == Action.DESTROY:
            sizes[name] -= nbytes
        elif action == Action.INCREMENT_VERSION:  # the same bytes may change category (e.g. input -> gradient)
            sizes[name] -= nbytes
            sizes[label(key, version + 1)] += nbytes
        if t > 0:
            if t0 is None:
                t0, at_start = t, dict(sizes)
            series.append((t, dict(sizes)))
        if sum(sizes.values()) > sum(at_peak.values()):
            at_peak = dict(sizes)
    step = max(1, len(series) // TIMELINE_POINTS)
    timeline = [((t - t0) / 1e6, s) for t, s in series[::step]] if t0 is not None else []
    return MemoryProfile(at_peak=at_peak, at_start=at_start or dict(sizes), timeline=timeline)


def _untold_by_timeline(mp, known: dict[int, tuple[str, int]], existing: dict[int, int] | None) -> tuple[dict, dict]:
    """What :func:`categorize` must add to the timeline: the bytes per category of ``known`` tensors no op touched
    (the profiler never saw them, yet they are present throughout), and the true size of each pre-existing tensor
    whose storage ``existing`` (or ``known``) sizes, where the profiler saw only a view of it."""
    from torch.profiler._memory_profiler import Action, TensorKey

    existing = {**(existing or {}), **{ptr: nbytes for ptr, (_, nbytes) in known.items()}}
    seen = {key.storage.ptr for _, _, (key, _), _ in mp.timeline if isinstance(key, TensorKey)}
    sizes = dict.fromkeys(CATEGORIES, 0)
    for ptr, (name, nbytes) in known.items():
        if ptr not in seen:
            sizes[name] += nbytes
    true_size = {
        key: existing[key.storage.ptr]
        for _, action, (key, _), _ in mp.timeline
        if action == Action.PREEXISTING and isinstance(key, TensorKey) and key.storage.ptr in existing
    }
    return sizes, true_size


# --------------------------------------------------------------------------- the independent peak


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def _data_bytes(field: str) -> int:
    """``field`` of /proc/self/status (VmRSS, VmHWM) less the file-backed resident pages (code), in bytes."""
    return (_status_kib(field) - _status_kib("RssFile")) * 1024


def return_freed_memory() -> None:
    """Have glibc hand every freed block of 64 KiB or more back to the system at once (fixed mmap and trim
    thresholds), so the resident set follows the live tensors; without it, freed activations stay resident."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 64 * 1024)  # M_TRIM_THRESHOLD
    trim_heap()


def current_bytes(device: torch.device) -> int:
    """What the process holds now: CUDA's allocated bytes on a GPU; on CPU the resident set (VmRSS) less its
    file-backed pages, which are code and libraries (DeepSpeed loads ~25 MiB of them while it initializes), not
    memory the training's data takes."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _data_bytes("VmRSS")


class PeakMeter:
    """The peak memory of what runs inside ``with meter:`` over ``floor`` (:func:`current_bytes` before the
    tensors of interest existed), measured without the profiler: CUDA's allocator peak on GPU, the resident
    high-water mark (VmHWM) less the file-backed pages (constant while an iteration runs) on CPU."""

    def __init__(self, device: torch.device, floor: int = 0):
        self.device, self.floor, self.peak = device, floor, 0

    def __enter__(self) -> "PeakMeter":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.floor
        else:
            self.peak = _data_bytes("VmHWM") - self.floor


# struct tcp_info (linux/tcp.h, Linux 4.19+): bytes_sent and bytes_retrans, unsigned 64-bit
TCP_INFO_BYTES_SENT, TCP_INFO_BYTES_RETRANS, TCP_INFO_SIZE = 200, 208, 216


def sent_bytes() -> int:
    """Payload bytes this process's TCP sockets have sent, retransmissions excluded (each socket's ``tcp_info``:
    ``bytes_sent - bytes_retrans``): what its collectives send, without headers, acknowledgements or anything
    another process sends. Counting the interfaces of the ranks' network namespace (``/proc/net/dev``) took all of
    those in, and once read 12 % above the usual count of a point measured again on fresh ranks."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(fd))
        except OSError:
            continue  # closed meanwhile, or not a socket family Python knows
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_SIZE)
        finally:
            sock.detach()  # the descriptor stays its owner's
        if len(info) < TCP_INFO_SIZE:
            raise RuntimeError(f"this kernel's tcp_info ({len(info)} bytes) has no bytes_sent: Linux 4.19+ needed")
        sent, retransmitted = struct.unpack_from("QQ", info, TCP_INFO_BYTES_SENT)
        total += sent - retransmitted
    return total
