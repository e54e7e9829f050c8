"""The end of a synchronized backward (the reducer's item 3): wait for each bucket in order and write its averages
back into ``.grad`` while later buckets are still in flight."""
from __future__ import annotations

import torch
import torch.distributed as dist


class WriteBack:
    """The reducer's finishing half, run once autograd has finished."""

    def _finalize(self) -> None:
        """Runs once autograd has finished: wait for each bucket, write its averages back to ``.grad``."""
        self.expect_hooks = False
        self._started = False
        timing = self.timing
        if timing is not None:
            timing.backward_end = timing.clock.stamp()
            if timing.backward_start is None:
                timing.backward_start = timing.backward_end
        if not self.overlap:
            self._launch_ready()
        futures, self._futures = self._futures, []  # their values hold the buckets: not kept past this iteration
        # the collective's own work on every bucket (in place: nothing to copy back), or on none: futures (a comm
        # hook's, or traced), as _launch chose for the whole iteration
        in_place = bool(futures) and isinstance(futures[0], dist.Work)
        # The common case: each bucket goes back to .grad as soon as it is reduced, while later buckets are still
        # in flight. Views, unused-parameter detection and missing .grad go through _write_back at the end.
        grads = None
        if not (self.as_view or self._used is not None or self._static_skip):
            grads = [p.grad for p in self.params]
            if any(g is None for g in grads):
                grads = None
        per_bucket = timing is not None and timing.per_bucket
        if per_bucket:  # finish stamped here, not by a callback on the comm thread; on the host clock a bucket
            # already done now reads as done now, not after the write-back of the buckets before it
            done = [timing.clock.on_host and (f.is_completed() if in_place else f.done()) for f in futures]
            timing.comm_end = now = timing.clock.stamp()
        with torch.no_grad():  # with create_graph=True this runs in grad mode: the copies are not part of it
            for b, f in enumerate(futures):
                value = f.wait()
                if timing is not None and not per_bucket and b == len(futures) - 1:
                    timing.comm_end = timing.clock.stamp()  # the stream now waits for every reduction
                if per_bucket:
                    if done[b]:
                        timing.bucket_finish[b] = now
                    else:
                        timing.bucket_finish[b] = timing.comm_end = timing.clock.stamp()
                    if timing.bucket_done is not None and timing.bucket_done[b] is None:
                        # the completion callback runs just after the future is marked done and may not have
                        # run yet: the wait's own stamp is then the closest bound
                        timing.bucket_done[b] = timing.bucket_finish[b]
                if not in_place:
                    if isinstance(value, list):  # a collective's own future: [reduced tensor]
                        value = value[0]
                    if value is not self.flats[b]:
                        self.flats[b].copy_(value)
                if grads is not None:
                    views = self._bucket_views[b]
                    if len(views) == 1:  # a bucket of one gradient: a plain copy costs less to issue
                        grads[self.buckets[b].param_indices[0]].copy_(views[0])
                    else:
                        torch._foreach_copy_([grads[i] for i in self.buckets[b].param_indices], views)
            if grads is None:
                unused_everywhere = set(self._static_skip)
                if self._used_work is not None:
                    self._used_work.wait()
                    if self._local_unused:  # only then is the bitmap read on the host
                        unused_everywhere = set((self._used_map == 0).nonzero().flatten().tolist())
                    self._used_work = self._used_map = None
                self._write_back(unused_everywhere)
        self.last_timing = timing

    def _write_back(self, skip: set[int]) -> None:
        """The rarer cases after all buckets are reduced: ``.grad`` as bucket views, unused-parameter detection
        (``skip``: unused on every rank), or a parameter without ``.grad`` yet."""
        if self.as_view:
            for i, p in enumerate(self.params):
                if i not in skip and (p.grad is None or p.grad.data_ptr() != self.views[i].data_ptr()):
                    p.grad = self.views[i]
            return
        grads, views = [], []
        for i, p in enumerate(self.params):
            if i in skip:
                continue
            if p.grad is None:
                p.grad = self.views[i].clone()
            else:
                grads.append(p.grad)
                views.append(self.views[i])
        if grads:
            torch._foreach_copy_(grads, views)
