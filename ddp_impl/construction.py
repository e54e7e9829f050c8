"""What construction checks and settles before the first forward: one device, the same parameters on every rank
(then rank 0's parameters and buffers everywhere), the caps in bytes, and torch 2.14's buffer settings."""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from .broadcast import broadcast_coalesced
from .buckets import mb_to_bytes
from .options import DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_CAP_MB


def check_arguments(timing) -> None:
    """What the constructor refuses before it communicates."""
    if timing not in (True, False, "trace"):
        raise ValueError(f"timing must be True, False or 'trace', got {timing!r}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "ddp_impl.DistributedDataParallel needs an initialized process group: call "
            "torch.distributed.init_process_group(...) first"
        )


def check_devices(module: nn.Module, backend: str) -> torch.device:
    """The one device every parameter to reduce is on (NCCL's on a GPU)."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise RuntimeError(
            "DistributedDataParallel is not needed when a module doesn't have any parameter "
            "that requires a gradient: there is nothing to reduce"
        )
    devices = {p.device for _, p in named}
    if len(devices) > 1:
        raise ValueError(f"parameters span devices {sorted(map(str, devices))}; use one device per process")
    device = next(iter(devices))
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(
            f"the NCCL backend needs CUDA tensors, but parameter {named[0][0]} is on {device}; "
            "move the module to its GPU first (module.to(f'cuda:{local_rank}')) or use Gloo"
        )
    return device


def sync_at_construction(module: nn.Module, group, world_size: int, device: torch.device, with_buffers: bool) -> None:
    """Every rank holds the same parameters (checked), then rank 0's parameters (and buffers) everywhere."""
    with current_device(device):  # object collectives run on the current CUDA device
        verify_same_parameters(module, group, world_size)
    if world_size > 1:
        states = [p.detach() for p in module.parameters()]
        if with_buffers:
            states += [b.detach() for b in module.buffers()]
        broadcast_coalesced(states, group)


def verify_same_parameters(module: nn.Module, group, world_size: int) -> None:
    """Every rank must wrap the same model, or buckets and collectives would not line up across ranks."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine, group=group)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if theirs == reference:
            continue
        for pos, (a, b) in enumerate(zip(reference, theirs)):
            if a != b:
                raise RuntimeError(
                    f"parameter mismatch at position {pos}: rank 0 has {a[0]} {a[1]} {a[2]}, "
                    f"rank {rank} has {b[0]} {b[1]} {b[2]}; every rank must wrap the same model"
                )
        raise RuntimeError(
            f"parameter count mismatch: rank 0 has {len(reference)} parameters, rank {rank} "
            f"has {len(theirs)}; every rank must wrap the same model"
        )


def caps_bytes(bucket_cap_mb: float | None, first_bucket_cap_mb: float | None) -> tuple[int, int]:
    """The caps in bytes; as torch 2.x, the first bucket gets 1 MiB only where the cap is left at its default."""
    if first_bucket_cap_mb is None:
        first_bucket_cap_mb = DEFAULT_FIRST_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    return mb_to_bytes(DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb), mb_to_bytes(
        first_bucket_cap_mb
    )


def buffer_sync(broadcast_buffers: bool | None, forward_sync_buffers: bool | None) -> tuple[bool, bool]:
    """(sync buffers before each forward, sync them at construction), as torch 2.14 resolves its arguments:
    ``forward_sync_buffers`` wins and leaves the construction sync on; the deprecated ``broadcast_buffers``
    governs both, with torch's FutureWarning."""
    if broadcast_buffers is not None:
        warnings.warn(
            "`broadcast_buffers` is deprecated (as in torch 2.14): use `forward_sync_buffers`, which does "
            "not stop the buffer broadcast at construction; "
            + (
                "it wins over `broadcast_buffers`, whose value is ignored"
                if forward_sync_buffers is not None
                else "keep `broadcast_buffers=False` where rank-local buffers must survive construction"
            ),
            FutureWarning,
            stacklevel=3,
        )
    if forward_sync_buffers is not None:
        return forward_sync_buffers, True
    sync = True if broadcast_buffers is None else broadcast_buffers
    return sync, sync


def current_device(device: torch.device):
    """On CUDA, make ``device`` current (object collectives and NCCL use the current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
