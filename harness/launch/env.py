"""Where this process runs, as the launcher's environment says: the one place outside the launcher's own
start-up that reads ``RANK``, whether CUDA is here, and the cores its ranks share. A leaf module (no harness
imports), so config, launch, sweep and drivers can all use it; tests replace ``cuda_available`` to play a GPU
machine."""

from __future__ import annotations

import contextlib
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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks_on_node: int, requested: int = 0) -> int:
    """``requested`` if positive, else the cores of this machine shared evenly by its ranks."""
    return requested if requested > 0 else max(1, available_cores() // max(1, ranks_on_node))


@contextlib.contextmanager
def environ(extra: dict[str, str]):
    """``os.environ`` with ``extra`` set for the block (spawned children inherit it), restored after."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
