"""Round-robin process group (the paper's Figure 12, Section 5.4).

One process group runs its collectives on one communicator, which caps how many allreduces proceed at once. The
paper's ``ProcessGroupRoundRobin`` dispatches consecutive collectives to k underlying groups so buckets can be
in flight concurrently. torch later removed that class; this is our own small version: bucket i's allreduce
goes to group ``i mod k`` (consecutive buckets on different groups, identically on every rank), and
everything else (broadcasts, the unused-parameter bitmap) uses the first group.
"""

from __future__ import annotations

import datetime
from typing import Sequence

import torch.distributed as dist


class RoundRobinProcessGroup:
    """k process groups taking the buckets' allreduces in turn; pass it as ``process_group`` to
    :class:`~ddp_impl.DistributedDataParallel`.

    Args:
        groups: the underlying process groups, each over every rank; the first also carries everything else.

    Example::

        >>> model = DistributedDataParallel(net, process_group=RoundRobinProcessGroup.new(3))
    """

    def __init__(self, groups: Sequence):
        if not groups:
            raise ValueError("RoundRobinProcessGroup needs at least one process group")
        self.groups = list(groups)

    @classmethod
    def new(
        cls, k: int, backend: str | None = None, timeout: datetime.timedelta | None = None
    ) -> "RoundRobinProcessGroup":
        """Create k new groups over all ranks. Collective: every rank must call it with the same k."""
        if k < 1:
            raise ValueError(f"round-robin needs k >= 1 groups, got {k}")
        kwargs = {} if timeout is None else {"timeout": timeout}
        return cls([dist.new_group(backend=backend, **kwargs) for _ in range(k)])

    def group_for(self, bucket_index: int):
        return self.groups[bucket_index % len(self.groups)]

    @property
    def primary(self):
        return self.groups[0]

    def size(self) -> int:
        return self.groups[0].size()

    def rank(self) -> int:
        return self.groups[0].rank()

    def __len__(self) -> int:
        return len(self.groups)
