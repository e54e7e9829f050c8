"""Communication hooks: how one flat bucket is reduced across ranks.

A hook is ``hook(group, bucket) -> torch.futures.Future`` whose value is the reduced bucket (or a one-element
list holding it, as a collective's own ``Work.get_future()`` gives). ``bucket`` already holds gradients divided
by the world size, so a plain sum gives the average. The reducer writes the future's value back into the bucket
when it differs from it, so compressing hooks may return a new tensor.
This mirrors torch's ``register_comm_hook`` idea (the paper's "future work: gradient compression").
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _checked(fut: torch.futures.Future, result: torch.Tensor) -> torch.Tensor:
    fut.value()  # re-raises a failed collective instead of returning a half-reduced bucket
    return result


def allreduce_hook(group, bucket: torch.Tensor) -> torch.futures.Future:
    """Plain sum allreduce (the default), in place, issued on the ProcessGroup itself (as torch's C++ reducer
    does; ``dist.all_reduce``'s Python checks cost ~5 us per bucket). Returns the collective's own future (value
    ``[bucket]``; a failed collective raises on ``wait``), so no Python callback runs on the communication thread."""
    return (dist.group.WORLD if group is None else group).allreduce([bucket]).get_future()


def _compress_hook(dtype: torch.dtype):
    def hook(group, bucket: torch.Tensor) -> torch.futures.Future:
        compressed = bucket.to(dtype)
        fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()
        return fut.then(lambda f: _checked(f, compressed))

    hook.__name__ = f"{str(dtype).removeprefix('torch.')}_compress_hook"
    hook.__doc__ = f"Allreduce in {dtype} to halve the bytes on the wire; the reducer casts back."
    return hook


fp16_compress_hook = _compress_hook(torch.float16)
bf16_compress_hook = _compress_hook(torch.bfloat16)

HOOKS = {"allreduce": allreduce_hook, "fp16": fp16_compress_hook, "bf16": bf16_compress_hook}
