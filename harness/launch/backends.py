"""The process-group backends and whether this machine can run a world size on one, checked before any launch."""

from __future__ import annotations

import torch.distributed as dist

from harness.launch import env

BACKENDS = ("gloo", "nccl", "mpi")


def check_backend(backend: str, world_size: int) -> None:
    """Raise ValueError unless this machine can run ``world_size`` ranks on ``backend``: NCCL needs CUDA and
    one visible GPU per rank on this node."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend == "mpi" and not dist.is_mpi_available():
        raise ValueError(
            "backend='mpi' needs a torch built with MPI, and torch.distributed.is_mpi_available() is "
            "False in this torch build (pip's wheels have no MPI); use backend='gloo' (CPU) or 'nccl' "
            "(GPUs), or a torch built from source with MPI"
        )
    if backend == "mpi" and not env.in_place():
        raise ValueError(
            "backend='mpi' needs ranks started by the MPI launcher (mpirun, or srun --mpi) with RANK, "
            "WORLD_SIZE and LOCAL_RANK exported; the spawned launcher cannot start MPI ranks"
        )
    if backend != "nccl":
        return
    if not env.cuda_available():
        raise ValueError("backend='nccl' needs CUDA, but torch.cuda.is_available() is False")
    local, gpus = env.ranks_on_this_node(world_size), env.cuda_devices()
    if local > gpus:
        raise ValueError(
            f"world_size={world_size} puts {local} ranks on this node but only {gpus} GPU(s) are "
            f"visible; backend='nccl' needs one GPU per rank"
        )
