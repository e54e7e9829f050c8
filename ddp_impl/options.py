"""DDP's settings as one object, and the constants they default to, defined once.

A caller with its own configuration (the harness's points, a training script's flags) builds one
:class:`DDPOptions` and hands it whole to ``DistributedDataParallel(model, **options.kwargs())``, instead of
restating every default and keyword on the way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

MIB = 1024 * 1024  # caps are in MiB, as torch's
DEFAULT_BUCKET_CAP_MB = 25  # torch's default cap
DEFAULT_FIRST_BUCKET_CAP_MB = 1  # torch's _DEFAULT_FIRST_BUCKET_BYTES, used only with the default cap


@dataclass(frozen=True)
class DDPOptions:
    """Every setting of :class:`~ddp_impl.DistributedDataParallel` but the module and its process group.

    Args:
        bucket_cap_mb: cap of a gradient bucket in MiB; 0 gives one bucket per parameter. ``None``: torch's
            default, 25 MiB with a first bucket of 1 MiB. ``"auto"``: found while training (``ddp_impl.autotune``).
        first_bucket_cap_mb: cap of the first bucket (the first gradients ready); ``None``: 1 MiB with the default
            cap, else ``bucket_cap_mb``.
        bucket_cap_mb_list: one cap per bucket instead, the last repeating (torch 2.14).
        find_unused_parameters: find, after each forward, the parameters that will get no gradient.
        static_graph: the same parameters are used the same number of times every iteration (torch's meaning).
        overlap: launch each bucket's allreduce during backward; ``False`` is the paper's non-overlapping baseline.
        rebuild_buckets: rebuild the buckets in the observed gradient order after the first iteration, as torch;
            ``False`` keeps the paper's static layout.
        gradient_as_bucket_view: each ``.grad`` is a view into its bucket (no copy back).
        comm_hook: a torch-API hook ``(state, GradBucket) -> Future``, or the short name of one of torch's own
            (``"allreduce"``, ``"fp16"``, ``"bf16"``); ``None``: the default allreduce.
        timing: per-iteration instrumentation: ``True``, ``False`` or ``"trace"`` (each bucket's times too).
        broadcast_buffers: deprecated; ``False`` stops every buffer broadcast.
        forward_sync_buffers: broadcast rank 0's buffers before each synchronized forward (default ``True``).
        init_sync: check and broadcast the parameters at construction.
        autotune_prior_mb: with ``"auto"``, caps ordered by predicted latency, best first; ``None``: coarse-to-fine.
    """

    bucket_cap_mb: float | str | None = None
    first_bucket_cap_mb: float | None = None
    bucket_cap_mb_list: Sequence[float] | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    overlap: bool = True
    rebuild_buckets: bool = True
    gradient_as_bucket_view: bool = False
    comm_hook: object = None
    timing: bool | str = True
    broadcast_buffers: bool | None = None
    forward_sync_buffers: bool | None = None
    init_sync: bool = True
    autotune_prior_mb: Sequence[float] | None = None

    def kwargs(self) -> dict:
        """The keyword arguments of ``DistributedDataParallel`` these options stand for."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
