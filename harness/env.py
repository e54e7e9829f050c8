"""Where this process runs, as the launcher's environment says: the one place outside the launcher's own
start-up that reads ``RANK``. A leaf module (no harness imports), so config, sweep and drivers can all use it."""
from __future__ import annotations

import os


def in_place() -> bool:
    """True under torchrun/SLURM-style launchers that already set RANK: the ranks are these processes."""
    return "RANK" in os.environ


def global_rank() -> int:
    """This process's rank under torchrun/SLURM; 0 in a plain process (the parent of spawned ranks)."""
    return int(os.environ.get("RANK", 0))


def is_writer() -> bool:
    """Only rank 0 writes results and figures (every rank runs the sweep under torchrun)."""
    return global_rank() == 0
