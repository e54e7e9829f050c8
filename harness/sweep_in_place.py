"""What a sweep does differently under torchrun (every rank runs it in place): only the points this job's world size
can run, and every rank agreeing on rank 0's view of what is pending, so that all form the same tasks."""

from __future__ import annotations

import os

from harness.config import PointConfig
from harness.launch.env import in_place, is_writer
from harness.launch.groups import init_in_place


def this_jobs_points(experiment: str, points: dict[str, PointConfig]) -> dict[str, PointConfig]:
    """Under torchrun, the points this job's WORLD_SIZE can run (the others skipped with a note, so one driver can
    serve jobs of several sizes); all of them elsewhere."""
    if not in_place():
        return points
    world = int(os.environ["WORLD_SIZE"])
    skipped = [pid for pid, p in points.items() if p.world_size != world]
    if skipped and is_writer():
        print(f"[{experiment}] skipping {len(skipped)} point(s) whose world_size != WORLD_SIZE={world}")
    return {pid: p for pid, p in points.items() if pid not in skipped}


def agree_in_place(
    unique: dict[str, PointConfig], pending: set[str], available_bytes: float
) -> tuple[set, float, bool]:
    """(pending points, available memory, whether this process writes results): as they are here, or under torchrun
    rank 0's, which every rank then shares."""
    if not (in_place() and unique):
        return pending, available_bytes, True
    first = next(iter(unique.values()))
    pending, available_bytes = _agree(pending, available_bytes, first.backend, first.timeout_s)
    return pending, available_bytes, is_writer()


def _agree(pending: set[str], available_bytes: float, backend: str, timeout_s: float) -> tuple[set[str], float]:
    """Under torchrun only rank 0's file system counts, and every rank must form the same tasks: broadcast rank
    0's pending points and available memory to every rank."""
    import torch.distributed as dist

    init_in_place(backend, timeout_s)
    box = [sorted(pending), available_bytes]
    dist.broadcast_object_list(box, src=0)
    return set(box[0]), box[1]
