"""Launching the buckets' collectives (the reducer's item 2): strictly in bucket-index order, our allreduce or the
registered comm hook, the usage bitmap of ``find_unused_parameters``, and a joined rank's zeros."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm_hooks import GradBucket
from .process_groups import RoundRobinProcessGroup

SUM = dist.AllreduceOptions()  # built once: the default (sum), passed so that no call builds its own


class BucketLaunch:
    """The reducer's launching part: what leaves a rank, in which order, scaled by how much."""

    def _launch_ready(self) -> None:
        pending, last, b = self._pending, len(self.buckets), self._next_launch
        while b < last and not pending[b]:
            self._launch(b)
            b += 1
            self._next_launch = b
        if b == last and self._used is not None:
            self._launch_used_map()

    def _launch(self, b: int) -> None:
        timing = self.timing
        if timing is not None and (b == 0 or timing.per_bucket):
            timing.bucket_launch[b] = timing.clock.stamp()
        traced = timing is not None and timing.bucket_done is not None
        if self.comm_hook is None and not traced:  # the collective's own work: in place, no future to build
            self._futures[b] = self._bucket_groups[b].allreduce([self.flats[b]], SUM)
            return
        self._futures[b] = self._reduce(b, self.flats[b], self._bucket_views[b])
        if traced:
            self._futures[b].add_done_callback(timing.stamp_done(b))

    def _reduce(self, b: int, flat: torch.Tensor, views: list[torch.Tensor]) -> torch.futures.Future:
        if self.comm_hook is None:  # in place on the ProcessGroup itself, as torch's C++ reducer does
            return self._bucket_groups[b].allreduce([flat], SUM).get_future()
        state = self.comm_state
        if isinstance(state, RoundRobinProcessGroup):
            state = state.group_for(b)
        return self.comm_hook(state, GradBucket(b, flat, views, self._bucket_params[b], b == len(self.buckets) - 1))

    # ---- uneven inputs (``join``) -------------------------------------------------------------------
    def set_divisor(self, ranks: int) -> None:
        """Average this iteration's gradients over ``ranks`` (the ranks still training, in a join context)."""
        self._set_scale(1.0 / ranks)

    def _set_scale(self, scale: float) -> None:
        self._scale = scale
        # the factor also as a 0-dim tensor per dtype: a multiply by it costs half as much to issue as one by a
        # Python number, and rounds as torch's does (float32/float64: to the gradient's dtype; others use the number)
        self._factors = {d: torch.tensor(scale, dtype=d) for d in (torch.float32, torch.float64)}
        self._param_factors = [self._factors.get(p.dtype, scale) for p in self.params]  # autograd keeps the dtype

    def reduce_zeros(self) -> None:
        """A joined rank's share of one synchronized backward of the others: the same collectives, in the same
        order, on zeros (the local usage bitmap for ``find_unused_parameters``), so the sum is the others'."""
        if self._order is not None and not self._order:  # never ran a backward: give the rebuild an order
            self._order = list(reversed(range(len(self.params))))
        futures = []
        for b, bucket in enumerate(self.buckets):
            zeros = torch.zeros_like(self.flats[b])
            views = [
                v.view(self.params[i].shape)
                for i, v in zip(bucket.param_indices, zeros.split([self.specs[i].numel for i in bucket.param_indices]))
            ]
            futures.append(self._reduce(b, zeros, views))
        if self._used is not None:
            self._launch_used_map()
            futures.append(self._used_work.get_future())
            self._used_work = self._used_map = None
        for f in futures:
            f.wait()

    def _launch_used_map(self) -> None:
        """Allreduce the usage bitmap; only a rank with a locally unused parameter will wait for it."""
        used, self._used = self._used, bytearray(len(self.params))
        device = self.params[0].device
        host = torch.frombuffer(used, dtype=torch.uint8).to(torch.int32)
        if device.type == "cuda":  # an asynchronous copy: no host sync unless a parameter is unused here
            host = host.pin_memory()
        self._used_map = host.to(device, non_blocking=True)
        self._local_unused = 0 in used
        self._used_work = dist.all_reduce(self._used_map, group=self.primary_group, async_op=True)
