"""The one way a timed loop reads the clock, so that every number in results/ is measured alike: host stamps taken
once the device's queued work is done (on a GPU the host only queues kernels; a clock read without waiting times
their launch, not their work), differences in milliseconds, and the first runs of a repeated measurement dropped
(they pay for warming caches, allocators and thread pools, which the measured runs must not).

    t0 = stamp(ctx); loss.backward(); backward_ms = ms(t0, stamp(ctx))
    copy_ms = timed_ms(ctx, lambda: dst.copy_(src), repeats=3, warmup=1)

Inside gradient hooks and completion callbacks read :func:`now` alone: waiting for the device there would change
what is measured.
"""

from __future__ import annotations

import time
from typing import Callable

now = time.perf_counter  # seconds; the only clock timings read


def stamp(ctx) -> float:
    """:func:`now` once ``ctx``'s device has finished its queued work (``ctx.synchronize()``, a no-op on CPU)."""
    ctx.synchronize()
    return now()


def ms(start: float, end: float) -> float:
    """Milliseconds from clock reading ``start`` to ``end``."""
    return (end - start) * 1e3


def timed_ms(ctx, fn: Callable[[], object], repeats: int, warmup: int = 0) -> list[float]:
    """``fn()`` run ``warmup + repeats`` times, each between two stamps; the last ``repeats`` durations (ms)."""
    times = []
    for _ in range(warmup + repeats):
        start = stamp(ctx)
        fn()
        times.append(ms(start, stamp(ctx)))
    return times[warmup:]
