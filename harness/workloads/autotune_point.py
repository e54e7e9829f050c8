"""A ``bucket_cap_mb="auto"`` point: trained, unmeasured, until its DDP's search settles, and the columns its rows
carry (``results/README.md``)."""

from __future__ import annotations

import json
import time
from typing import Callable

from ddp_impl.cap_search import WARMUP_ITERS

SETTLE_LIMIT = 60  # synchronized iterations: twice the search's budget


def settle(ddp, iterate: Callable[[int], None], sync_every: int) -> tuple[int, float]:
    """Run ``iterate(n)`` for n = 0, 1, ... until ``ddp``'s search has settled (by its 30th synchronized iteration), so
    that a point's warm-up and measured iterations run on the settled cap. Returns (iterations run, wall ms of those
    after the first two synchronized ones: any DDP's first iterations run slow, which is not the search's cost)."""
    n, start = 0, time.perf_counter()
    while ddp.autotune_result is None:
        if n == WARMUP_ITERS * sync_every:
            start = time.perf_counter()
        if n == SETTLE_LIMIT * sync_every:
            raise RuntimeError(f"bucket_cap_mb='auto': the search had not settled after {n} iterations")
        iterate(n)
        n += 1
    return n, (time.perf_counter() - start) * 1e3


def columns(ddp, cfg, it: int, iterations: int, ms: float) -> dict:
    """The autotune columns of measured iteration ``it``: the settled cap, what the search took, and on the last row
    its log and result."""
    out = dict(bucket_cap_mb_used=ddp.bucket_cap_mb_now, autotune_iterations=iterations, autotune_ms=ms)
    if it == cfg.warmup + cfg.iters - 1:
        out["autotune_json"] = json.dumps(dict(log=ddp.autotune_log, result=ddp.autotune_result))
    return out
