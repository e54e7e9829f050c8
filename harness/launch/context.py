"""What a rank function is given (:class:`RankContext`), built alike for spawned ranks and ranks run in place:
its rank, device and torch threads, set here once so every workload measures under the same settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.launch import env


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    num_threads: int
    timeout_s: float
    group: Any = None  # process group to use; None = the default (WORLD)

    def synchronize(self) -> None:
        """Wait for queued device work, so host clocks bracket the real work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def make_context(
    rank, world_size, local_rank, local_world_size, backend, timeout_s, threads, group=None
) -> RankContext:
    """This rank's context, with torch's threads set (``threads``; 0 = its share of the node's cores) and, for
    NCCL, the current CUDA device set to ``local_rank``."""
    num_threads = env.threads_per_rank(local_world_size, threads)
    torch.set_num_threads(num_threads)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return RankContext(rank, world_size, local_rank, backend, device, num_threads, timeout_s, group)
