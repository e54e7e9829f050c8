"""Communication hooks with torch's API: ``hook(state, bucket) -> Future``, registered by
``DistributedDataParallel.register_comm_hook(state, hook)``.

``bucket`` is a :class:`GradBucket` with the methods of torch's ``dist.GradBucket``, so torch's own hooks
(``default_hooks.allreduce_hook``, ``fp16_compress_hook``, ``bf16_compress_hook``, ``powerSGD_hook``) run
unchanged. As in torch, the buffer holds the local gradients *not* divided by the world size: averaging is the
hook's job. The future's value (a tensor, or a one-element list as a collective's own future gives) is the
reduced bucket; the reducer copies it back when it is not the bucket itself. Without a registered hook the
reducer averages with a plain allreduce of its own (the paper's design, and torch's default).
This is the paper's "future work: gradient compression" as torch later shipped it.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class GradBucket:
    """What a hook sees of one bucket: torch's ``dist.GradBucket`` methods, over our flat buffer."""

    __slots__ = ("_index", "_buffer", "_gradients", "_parameters", "_is_last")

    def __init__(
        self,
        index: int,
        buffer: torch.Tensor,
        gradients: list[torch.Tensor],
        parameters: list[torch.Tensor],
        is_last: bool,
    ):
        self._index, self._buffer, self._gradients = index, buffer, gradients
        self._parameters, self._is_last = parameters, is_last

    def index(self) -> int:
        """The bucket's position in launch order (stable across iterations except at the one rebuild)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient buffer."""
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """One view of the buffer per parameter, shaped like the parameter."""
        return self._gradients

    def parameters(self) -> list[torch.Tensor]:
        return self._parameters

    def is_last(self) -> bool:
        """True for the last bucket launched in an iteration (hooks count iterations with it)."""
        return self._is_last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor


# Short names for torch's own hooks: one vocabulary, torch's functions.
ALIASES = {
    "allreduce": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


def resolve(hook) -> object:
    """A hook given by short name or as a callable ``(state, GradBucket) -> Future``."""
    if isinstance(hook, str):
        if hook not in ALIASES:
            raise ValueError(
                f"unknown comm_hook {hook!r}; choose one of {sorted(ALIASES)} or pass a callable "
                "(state, bucket) -> torch.futures.Future, such as torch's powerSGD_hook"
            )
        return ALIASES[hook]
    if not callable(hook):
        raise TypeError(f"comm_hook must be callable, got {type(hook).__name__}")
    return hook
