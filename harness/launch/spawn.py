"""Run a function on ``world_size`` ranks: spawned here, or in place under torchrun.

``launch(fn, world_size, backend, args=...)`` calls ``fn(ctx, *args)`` on every rank with a
:class:`RankContext` and returns the per-rank return values, indexed by rank.

* Spawned (RANK not set): one process per rank on this machine, forked from a server that has imported torch
  once (``forkserver``; ``spawn`` on a CUDA machine and for settings read at process start). The parent hosts
  the rendezvous TCPStore on a kernel-chosen free port, so there is no port race. Each rank puts its result
  or traceback on a queue; the parent fails the launch (and terminates the other ranks) as soon as one rank
  reports an error or dies without reporting, so a crashed rank never hangs the parent. A :class:`RankPool`
  keeps such ranks alive for many launches (a sweep's points): ``launch`` is a pool used once.
* In place (RANK set, e.g. ``torchrun``/SLURM): env:// rendezvous (RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR/PORT); ``fn`` runs in this process and results are all-gathered, so every rank gets the list.
  The default process group is created once and reused by later launches in the same job.
* Emulated network: :class:`harness.netem.shaping.NamespacePool` keeps a :class:`RankPool` inside a private network
  namespace (the sweep picks it for points with a ``net``); this module knows nothing of it, and runs only the
  set-up function it is given in each rank (``rank_setup``).

Modules: :mod:`harness.launch.pool` (spawned ranks, kept for many launches), :mod:`harness.launch.context` (what
``fn`` is given), :mod:`harness.launch.failures` (the error a failed launch raises); their public names are
importable from here too.

Every process group gets ``timeout_s``, so a collective waiting on a hung or dead peer raises instead of
blocking forever. Every rank, spawned or in place, ends by :func:`harness.launch.groups.end_rank` (spawned ranks when
their pool closes, torchrun/SLURM ranks at exit).
Threads: each rank uses ``max(1, cores // ranks_on_this_node)`` unless told otherwise, and records it in
``ctx.num_threads``. NCCL ranks use GPU ``local_rank``.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import torch.distributed as dist

from harness.launch import env
from harness.launch.backends import check_backend
from harness.launch.context import RankContext, make_context
from harness.launch.failures import LaunchError, launch_error
from harness.launch.groups import init_in_place
from harness.launch.pool import RankPool

__all__ = ["LaunchError", "RankContext", "RankPool", "find_free_port", "launch", "refuse_in_bootstrapping_child"]


def find_free_port() -> int:
    """A currently free TCP port on localhost (may be taken by the time it is used; prefer TCPStore(0))."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_in_place(fn, world_size, backend, args, timeout_s, threads) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"world_size={world_size} but the launcher started WORLD_SIZE={env_world} ranks")
    init_in_place(backend, timeout_s)
    group = None
    if dist.get_backend() != backend:  # e.g. a gloo point inside an nccl job
        group = dist.new_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    ctx = make_context(rank, world_size, local_rank, local_world, backend, timeout_s, threads, group)
    try:
        status = ("ok", fn(ctx, *args), 0.0)
    except Exception:  # noqa: BLE001 - peers must learn of it
        status = ("error", traceback.format_exc(), time.time())  # when: the first to fail is the cause
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, status, group=group)
    failed = sorted((when, r) for r, (state, _, when) in enumerate(gathered) if state != "ok")
    if failed:
        raise launch_error({r: gathered[r][1] for _, r in failed}, world_size, backend)
    return [payload for _, payload, _ in gathered]


def refuse_in_bootstrapping_child() -> None:
    """Spawned ranks re-import the launching script; without a main guard it would launch (and store) again."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "a spawned rank is re-running the launching script while it starts up: put the "
            "driver's code under `if __name__ == '__main__':`"
        )


def launch(
    fn: Callable[..., Any],
    world_size: int,
    backend: str = "gloo",
    *,
    args: Sequence = (),
    timeout_s: float = 300.0,
    threads: int = 0,
    deadline_s: float | None = None,
    rank_env: dict | None = None,
) -> list:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks; return the results indexed by rank.

    ``fn`` must be a module-level function (it is pickled into spawned ranks). ``timeout_s`` is the
    process-group timeout; ``threads`` (0 = auto) the torch threads per rank; ``deadline_s`` an optional
    wall-clock limit for the whole launch (spawned mode); ``rank_env`` is set in the spawned ranks' environment.
    Raises :class:`LaunchError` if any rank fails.
    (Ranks behind an emulated network: ``harness.netem.shaping.NamespacePool``, which runs a :class:`RankPool` inside.)
    """
    refuse_in_bootstrapping_child()
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    check_backend(backend, world_size)
    if env.in_place():
        return _run_in_place(fn, world_size, backend, args, timeout_s, threads)
    sys.stdout.flush()
    with RankPool(world_size, backend, timeout_s=timeout_s, threads=threads, env=rank_env) as pool:
        return pool.run(fn, args, deadline_s)
