"""Rank ``src``'s tensors to every rank of a group, a chunk at a time: the construction sync, the buffer sync
before a forward, and the final model sync of ``join()``."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .options import MIB

BROADCAST_CHUNK_BYTES = 250 * MIB  # torch's broadcast_bucket_size: bounds the extra memory of the broadcast


@torch.no_grad()
def broadcast_coalesced(
    tensors: list[torch.Tensor], group, src: int = 0, chunk_bytes: int = BROADCAST_CHUNK_BYTES
) -> None:
    """Broadcast the tensors of ``src`` (a rank in ``group``) with one collective per chunk of one (device, dtype)
    instead of one per tensor.

    A chunk holds at most ``chunk_bytes`` (or one tensor, if bigger), so the extra memory is bounded, as torch's
    250 MiB broadcast buckets. Up to two chunks are in flight: one is copied out while the next is on the wire.
    """
    src = dist.get_global_rank(group, src)
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
