"""What a training point's settings must agree on among themselves (``harness.config.validate`` calls it): each
setting that only some systems have, refused in one line naming it, before anything is spawned."""

from __future__ import annotations

import math

from ddp_impl.autotune import AUTO
from harness.workloads.systems import DDP_IMPLS


def check_train(cfg) -> None:
    """Raise ValueError naming the first setting of the TrainConfig ``cfg`` its other settings rule out."""
    if cfg.round_robin_groups > 1 and cfg.impl != "ours":
        raise ValueError(f"round_robin_groups={cfg.round_robin_groups} needs impl='ours', got {cfg.impl!r}")
    if not cfg.overlap and cfg.impl != "ours":
        raise ValueError(f"overlap=False is only available with impl='ours' (got {cfg.impl!r}, which always overlaps)")
    if cfg.comm_hook and cfg.impl not in DDP_IMPLS:
        raise ValueError(f"comm_hook={cfg.comm_hook!r} needs impl 'ours' or 'torch', got {cfg.impl!r}")
    if cfg.sync_every > 1 and cfg.impl not in ("local", *DDP_IMPLS):
        raise ValueError(
            f"sync_every={cfg.sync_every} (no_sync) is measured for impl 'ours' and 'torch' only, got {cfg.impl!r}"
        )
    if cfg.replicas > 1 and cfg.impl != "threads":
        raise ValueError(f"replicas={cfg.replicas} needs impl='threads', got {cfg.impl!r}")
    if cfg.impl == "threads" and cfg.world_size != 1:
        raise ValueError(
            f"impl='threads' runs its replicas in one process: world_size must be 1, got "
            f"{cfg.world_size} (use replicas=N)"
        )
    if cfg.gradient_as_bucket_view and cfg.impl not in DDP_IMPLS:
        raise ValueError(f"gradient_as_bucket_view=True needs impl 'ours' or 'torch', got {cfg.impl!r}")
    if cfg.memory and cfg.malloc != "default":
        raise ValueError(
            f"memory=True measures the resident set as glibc hands freed memory back, which "
            f"malloc={cfg.malloc!r} prevents: measure memory with malloc='default'"
        )
    if cfg.bucket_cap_mb == AUTO and cfg.impl != "ours":
        raise ValueError(f"bucket_cap_mb='auto' is ours's own (the others take a fixed cap), got impl={cfg.impl!r}")
    if cfg.autotune_prior_mb and (
        cfg.bucket_cap_mb != AUTO or not all(c >= 0 for c in prior_caps(cfg.autotune_prior_mb))
    ):
        raise ValueError(
            f"autotune_prior_mb={cfg.autotune_prior_mb!r} needs bucket_cap_mb='auto' and comma-separated caps >= 0"
        )
    if cfg.trace_buckets and cfg.impl != "ours":
        raise ValueError(f"trace_buckets=True needs impl='ours' (its per-bucket timing), got {cfg.impl!r}")


def prior_caps(text: str) -> list[float]:
    """``autotune_prior_mb``'s caps (NaN for a word that is not a number, which :func:`validate` refuses)."""
    return [_float_or_nan(c) for c in text.split(",") if c.strip()]


def _float_or_nan(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
