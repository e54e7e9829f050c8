"""What this machine must provide for a sweep's points, checked once before anything is launched.

:func:`harness.config.validate` checks values; this checks the machine: GPUs for NCCL (one per rank on this
node), user+network namespaces and ``tc`` for an emulated network (and no emulation under torchrun, whose
ranks already run on the real network), a data set's files on disk. Each distinct requirement is checked
once, whatever the number of points. Raises ValueError (:class:`harness.netem.NetemUnavailable` for the
network) saying what is missing and what to use instead.
"""
from __future__ import annotations

import importlib.util
from typing import Iterable

from harness import env, netem
from harness.config import ConvergenceConfig, PointConfig
from harness.data import check_dataset
from harness.launch import check_backend, check_malloc_env


def preflight(points: Iterable[PointConfig]) -> None:
    """Check the machine for resolved (validated) points."""
    points = list(points)
    for backend, world_size in sorted({(p.backend, p.world_size) for p in points}):
        check_backend(backend, world_size)
    for p in points:
        if getattr(p, "impl", "").startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
            raise ValueError(f"impl={p.impl!r} needs DeepSpeed, which is not installed: `make setup` installs it "
                             "(pip install deepspeed==0.19.8)")
        if getattr(p, "impl", "") == "threads" and env.cuda_available() and env.cuda_devices() < p.replicas:
            raise ValueError(f"impl='threads' with replicas={p.replicas} runs nn.DataParallel on one GPU per "
                             f"replica, but {env.cuda_devices()} are visible")
    for malloc in sorted({getattr(p, "malloc", "default") for p in points}):
        check_malloc_env(malloc)
    emulated = sorted({p.net for p in points if p.net != "loopback"})
    if emulated and env.in_place():
        raise ValueError(f"net={emulated[0]!r} cannot apply under torchrun/SLURM (RANK is set): the ranks already "
                         f"run on the real network; use net='loopback'")
    if emulated:
        netem.require()  # NetemUnavailable (a ValueError) names what is missing
    for dataset, data_dir in sorted({(p.dataset, p.data_dir) for p in points if isinstance(p, ConvergenceConfig)}):
        check_dataset(dataset, data_dir)
