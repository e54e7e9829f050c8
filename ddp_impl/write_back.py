"""The end of a synchronized backward (the reducer's item 3): wait for each bucket in order and write its averages
back into ``.grad`` while later buckets are still in flight."""

from __future__ import annotations

import torch
import torch.distributed as dist


class WriteBack:
    """The reducer's finishing half, run once autograd has finished, and the check that it ran."""

    def check_prior_finished(self) -> None:
        """Raise if the last armed backward began but never readied every bucket: its gradients were never
        averaged (a parameter got no gradient, or backward raised). Like torch, the DDP stays in this state."""
        if not (self.expect_hooks and self._started):
            return
        missing = [f"{n} (index {i})" for i, (n, ready) in enumerate(zip(self.names, self._ready)) if not ready]
        raise RuntimeError(
            "Expected to have finished reduction in the prior iteration before starting a new one: the previous "
            f"backward did not reduce all gradients, so training on would use gradients that were never averaged. "
            f"Parameters that did not receive grad on rank {dist.get_rank()}: {', '.join(missing)}. "
            "Either that backward raised an exception (gradients of a failed backward cannot be averaged; rebuild "
            "the DDP model, or retry in a way that completes backward on every rank), or these parameters took no "
            "part in the loss: if they are legitimately unused in some iterations, construct "
            "DistributedDataParallel with find_unused_parameters=True; otherwise make sure every output that "
            "depends on them takes part in the loss."
        )

    def _finalize(self) -> None:
        """Runs once autograd has finished: wait for each bucket, write its averages back to ``.grad``."""
        self.expect_hooks = self._started = self._hot_armed = False
        self.reductions += 1
        timing = self.timing
        if timing is not None:
            _stamp_backward_end(timing)
        if not self.overlap:
            self._launch_ready()
        futures, self._futures = self._futures, []  # their values hold the buckets: not kept past this iteration
        sent, self._sent = self._sent, []  # nor the gradients reduced in place
        # the collective's own work on every bucket (in place: nothing to copy back), or on none: futures (a comm
        # hook's, or traced), as _launch chose for the whole iteration
        in_place = bool(futures) and isinstance(futures[0], dist.Work)
        # The common case: each bucket goes back to .grad as soon as it is reduced, while later buckets are still
        # in flight. Views, unused-parameter detection and missing .grad go through _write_back at the end.
        grads = self._grads_to_fill()
        with torch.no_grad():  # with create_graph=True this runs in grad mode: the copies are not part of it
            self._drain(futures, sent, in_place, grads, timing)
            if grads is None:
                skip = self._unused_everywhere()
                skip.update(self.buckets[b].param_indices[0] for b, t in enumerate(sent) if t is not self.flats[b])
                self._write_back(skip)
        self.last_timing = timing

    def _drain(self, futures: list, sent: list, in_place: bool, grads: list | None, timing) -> None:
        """Wait for each bucket in order, stamp its finish, and copy it back into ``grads`` (unless reduced in its
        ``.grad``)."""
        flats, bucket_views, buckets, last = self.flats, self._bucket_views, self.buckets, len(futures) - 1
        finish = timing.bucket_finish if timing is not None and timing.per_bucket else None
        if finish is not None:  # finish stamped here, not by a callback on the comm thread; on the host clock a
            # bucket already done now reads as done now, not after the write-back of the buckets before it
            clock, traced = timing.clock, timing.bucket_done
            done = [clock.on_host and (f.is_completed() if in_place else f.done()) for f in futures]
            timing.comm_end = now = clock.stamp()
        for b, f in enumerate(futures):
            value = f.wait()
            if finish is not None:
                if done[b]:
                    finish[b] = now
                else:
                    finish[b] = timing.comm_end = clock.stamp()
                if traced is not None and traced[b] is None:
                    # the completion callback runs just after the future is marked done and may not have
                    # run yet: the wait's own stamp is then the closest bound
                    traced[b] = finish[b]
            elif timing is not None and b == last:
                timing.comm_end = timing.clock.stamp()  # the stream now waits for every reduction
            if not in_place:
                if isinstance(value, list):  # a collective's own future: [reduced tensor]
                    value = value[0]
                if value is not flats[b]:
                    flats[b].copy_(value)
            if grads is not None and sent[b] is flats[b]:  # else reduced in its .grad: nothing to copy
                views = bucket_views[b]
                if len(views) == 1:  # a bucket of one gradient: a plain copy costs less to issue
                    grads[buckets[b].param_indices[0]].copy_(views[0])
                else:
                    torch._foreach_copy_([grads[i] for i in buckets[b].param_indices], views)

    def _grads_to_fill(self) -> list[torch.Tensor] | None:
        """Every ``.grad``, to fill bucket by bucket as each is reduced; None where the end goes through
        :meth:`_write_back` (views, unused parameters, a parameter without ``.grad`` yet)."""
        if self.as_view or self._used is not None or self._static_skip:
            return None
        grads = [p.grad for p in self.params]
        return None if any(g is None for g in grads) else grads

    def _unused_everywhere(self) -> set[int]:
        """The parameters no rank used in this iteration (static graph, or the allreduced usage bitmap)."""
        unused = set(self._static_skip)
        if self._used_work is not None:
            self._used_work.wait()
            if self._local_unused:  # only then is the bitmap read on the host
                unused = set((self._used_map == 0).nonzero().flatten().tolist())
            self._used_work = self._used_map = None
        return unused

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


def _stamp_backward_end(timing) -> None:
    timing.backward_end = timing.clock.stamp()
    if timing.backward_start is None:
        timing.backward_start = timing.backward_end
