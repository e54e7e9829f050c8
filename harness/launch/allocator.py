"""glibc's allocator in the ranks: the settings a point's ``malloc`` names, and giving freed memory back.

"retain": freed memory stays in the process for reuse, as CUDA's caching allocator keeps it on a GPU; with glibc's
defaults a big block freed and allocated again in every iteration is faulted in page by page each time (BERT-base's
backward: 0 to 130k faults, 410 to 650 ms, depending on the heap's history). glibc reads these settings once, at
process start, so they reach spawned ranks through their environment.
"""

from __future__ import annotations

import ctypes
import os

from harness.launch import env

MALLOC_ENV = {"default": {}, "retain": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**62)}}


def check_malloc_env(malloc: str) -> None:
    """Ranks started by torchrun/SLURM read their allocator's settings from the environment they were started
    with, which this process cannot change: refuse ``MALLOC_ENV[malloc]`` there unless it is already exported."""
    missing = {k: v for k, v in MALLOC_ENV[malloc].items() if os.environ.get(k) != v}
    if missing and env.in_place():
        raise ValueError(
            f"malloc={malloc!r} under torchrun/SLURM: export "
            + " ".join(f"{k}={v}" for k, v in missing.items())
            + " before launching"
        )


def trim_heap() -> None:
    """Hand the heap's free memory back to the system (glibc keeps it otherwise); pool ranks do it between
    tasks, so an idle rank holds only what it still uses."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
