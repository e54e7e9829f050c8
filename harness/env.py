"""Where this process runs, as the launcher's environment says: the one place outside the launcher's own
start-up that reads ``RANK``, and whether CUDA is here. A leaf module (no harness imports), so config, launch,
sweep and drivers can all use it; tests replace ``cuda_available`` to play a GPU machine."""
from __future__ import annotations

import os


def in_place() -> bool:
    """True under torchrun/SLURM-style launchers that already set RANK: the ranks are these processes."""
    return "RANK" in os.environ


def global_rank() -> int:
    """This process's rank under torchrun/SLURM; 0 in a plain process (the parent of spawned ranks)."""
    return int(os.environ.get("RANK", 0))


def default_world_size(backend: str) -> int:
    """torchrun's WORLD_SIZE in place, else every visible GPU for NCCL (one is enough), else 2 CPU ranks."""
    if in_place() and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return max(1, cuda_devices()) if backend == "nccl" else 2


def is_writer() -> bool:
    """Only rank 0 writes results and figures (every rank runs the sweep under torchrun)."""
    return global_rank() == 0


def ranks_on_this_node(world_size: int) -> int:
    """Ranks sharing this machine: LOCAL_WORLD_SIZE under torchrun, else all of them (spawned)."""
    if in_place() and "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return world_size


def cuda_available() -> bool:
    """Whether this process sees a CUDA device (imports torch only when asked)."""
    import torch

    return torch.cuda.is_available()


def cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()
