"""What this machine must provide for a sweep's points, checked once before anything is launched.

:func:`harness.config.validate` checks values; this checks the machine: GPUs for NCCL (one per rank on this
node), memory for every rank it would spawn, user+network namespaces and ``tc`` for an emulated network (and no
emulation under torchrun, whose ranks already run on the real network), a data set's files on disk. Each
distinct requirement is checked once, whatever the number of points. Raises ValueError
(:class:`harness.netem.shaping.NetemUnavailable` for the network) saying what is missing and what to use instead.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path
from typing import Iterable

from ddp_impl.options import MIB
from harness.config import AllreduceConfig, ConvergenceConfig, PointConfig, TrainConfig
from harness.launch import env
from harness.launch.allocator import check_malloc_env
from harness.launch.backends import check_backend
from harness.netem import shaping as netem
from harness.workloads.data import check_dataset
from harness.workloads.models import build_model

# What a spawned CPU rank holds before any model: Python, torch and its process group (measured: 305 MB private
# per rank of an idle pool of 4). A lower bound: a world size is refused only where it surely cannot fit.
RANK_BASE_BYTES = 280 * MIB
GB = 1e9


def preflight(points: Iterable[PointConfig]) -> None:
    """Check the machine for resolved (validated) points."""
    points = list(points)
    for backend, world_size in sorted({(p.backend, p.world_size) for p in points}):
        check_backend(backend, world_size)
    for p in points:
        if getattr(p, "impl", "").startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
            raise ValueError(
                f"impl={p.impl!r} needs DeepSpeed, which is not installed: `make setup` installs it "
                "(pip install deepspeed==0.19.8)"
            )
        if getattr(p, "impl", "") == "threads" and env.cuda_available() and env.cuda_devices() < p.replicas:
            raise ValueError(
                f"impl='threads' with replicas={p.replicas} runs nn.DataParallel on one GPU per "
                f"replica, but {env.cuda_devices()} are visible"
            )
    check_memory(points)
    for malloc in sorted({getattr(p, "malloc", "default") for p in points}):
        check_malloc_env(malloc)
    emulated = sorted({p.net for p in points if p.net != "loopback"})
    if emulated and env.in_place():
        raise ValueError(
            f"net={emulated[0]!r} cannot apply under torchrun/SLURM (RANK is set): the ranks already "
            f"run on the real network; use net='loopback'"
        )
    if emulated:
        netem.require()  # NetemUnavailable (a ValueError) names what is missing
    for dataset, data_dir in sorted({(p.dataset, p.data_dir) for p in points if isinstance(p, ConvergenceConfig)}):
        check_dataset(dataset, data_dir)


def memory_bytes() -> tuple[float, float]:
    """(available, total) bytes of this machine's memory, as the kernel says (``/proc/meminfo``; inf elsewhere)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return tuple(int(info[k].split()[0]) * 1024 for k in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        return math.inf, math.inf


@functools.lru_cache(maxsize=None)
def model_param_bytes(model: str) -> int:
    """The bytes of a model's parameters (built on the meta device: nothing allocated)."""
    import torch

    with torch.device("meta"):
        return sum(p.numel() * p.element_size() for p in build_model(model).parameters())


# Whole parameter-sized tensors a rank holds at least: weights and gradients, fewer where a system shards them.
FULL_COPIES = {"deepspeed2": 1, "fsdp": 0, "fsdp_keep": 0, "deepspeed3": 0}
COPIES_HELD = {2: "weights and gradients", 1: "weights"}


def rank_bytes(p: PointConfig) -> tuple[float, str]:
    """At least how many bytes one rank of ``p`` holds, and what they are beyond the process (for the message)."""
    if isinstance(p, TrainConfig) and FULL_COPIES.get(p.impl, 2):
        copies = FULL_COPIES.get(p.impl, 2)
        replicas = f"{p.replicas} replicas x " if p.replicas > 1 else ""
        return (
            RANK_BASE_BYTES + p.replicas * copies * model_param_bytes(p.model),
            f" + {replicas}{p.model}'s {COPIES_HELD[copies]}",
        )
    if isinstance(p, AllreduceConfig):
        return RANK_BASE_BYTES + 4 * p.total_params, f" + {p.total_params} float32 to allreduce"
    return RANK_BASE_BYTES, ""


def check_memory(points: list[PointConfig]) -> None:
    """Refuse a world size whose ranks, all spawned on this machine, cannot fit in the memory available now (a
    lower bound per rank: :data:`RANK_BASE_BYTES` plus the parameter-sized tensors no system goes without), with
    the numbers. Under torchrun the launcher has placed the ranks already: nothing to check."""
    if env.in_place() or not points:
        return
    available = memory_bytes()[0]
    worst = max(points, key=lambda p: p.world_size * rank_bytes(p)[0])
    per_rank, what = rank_bytes(worst)
    need = worst.world_size * per_rank
    if need <= available:
        return
    fit = int(available // per_rank)
    raise ValueError(
        f"world_size={worst.world_size} needs at least {need / GB:.1f} GB of memory on this machine "
        f"({worst.world_size} ranks x {per_rank / GB:.2f} GB: {RANK_BASE_BYTES / GB:.2f} GB a process "
        f"holds before its model{what}), but {available / GB:.1f} GB is available: at most {fit} "
        f"rank(s) fit here (more need more hosts: torchrun, harness/README.md)"
    )
