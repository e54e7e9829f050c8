"""Where gradients are reduced: one flat tensor per bucket and a view of it per parameter, built from a layout
and rebuilt once in the gradient order the first iteration showed (the reducer's item 6), and how gradients are
copied in, averaged (item 2)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from .buckets import Bucket, assign_buckets
from .process_groups import RoundRobinProcessGroup

# A gradient this large (elements) is copied into its bucket by its own hook, as soon as it is final: its copy
# costs far more than launching it, and copying it later would delay the bucket's launch. Smaller ones wait for
# the bucket's fused copy (on CPU, 64 Ki float32 elements take tens of microseconds; a launch takes a few).
EAGER_COPY_NUMEL = 1 << 16


class BucketStore:
    """The reducer's storage: ``flats``, ``views``, the per-bucket lists the hot path indexes, and their filling."""

    layout_order: list[int] | None = None  # the gradient order the buckets follow once rebuilt (None: reverse)
    reductions = 0  # synchronized backwards finished: the same count on every rank

    def _build(self, buckets: list[Bucket]) -> None:
        """Allocate one flat tensor per bucket and a view of it per parameter."""
        self.buckets = buckets
        self.flats = [torch.zeros(b.numel, dtype=b.dtype, device=b.device) for b in buckets]
        self.views: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        self.bucket_of = [0] * len(self.params)
        self._deferred_runs: list[list[torch.Tensor]] = []  # per bucket: slices holding only small gradients
        self._deferred: list[list[int]] = []  # per bucket: its small gradients, copied together once all are final
        for b, flat in zip(buckets, self.flats):
            offset, runs, deferred = 0, [], []
            for i in b.param_indices:
                numel = self.specs[i].numel
                self.views[i] = flat[offset : offset + numel].view(self.params[i].shape)
                self.bucket_of[i] = b.index
                if numel < EAGER_COPY_NUMEL:
                    deferred.append(i)
                    if runs and runs[-1][1] == offset:
                        runs[-1][1] += numel
                    else:
                        runs.append([offset, offset + numel])
                offset += numel
            self._deferred_runs.append([flat[start:end] for start, end in runs])
            self._deferred.append(deferred)
        self.bucket_sizes = [len(b.param_indices) for b in buckets]
        self._single = [n == 1 for n in self.bucket_sizes]
        self._bucket_views = [[self.views[i] for i in b.param_indices] for b in buckets]
        self._bucket_params = [[self.params[i] for i in b.param_indices] for b in buckets]
        self._deferred_views = [[self.views[i] for i in d] for d in self._deferred]
        self._deferred_params = [[self.params[i] for i in d] for d in self._deferred]
        self._alone = [False] * len(self.params)  # a bucket's only small gradient: filled by its own multiply
        for d in self._deferred:
            if len(d) == 1:
                self._alone[d[0]] = True
        group = self.group  # each bucket's own, looked up once here rather than at every launch
        round_robin = isinstance(group, RoundRobinProcessGroup)
        self._bucket_groups = [group.group_for(b.index) if round_robin else group for b in buckets]

    @property
    def primary_group(self):
        return self.group.primary if isinstance(self.group, RoundRobinProcessGroup) else self.group

    def rebuild_if_pending(self) -> None:
        """Called at the start of a synchronized forward (every rank, before any activation exists)."""
        if self.rebuild_pending and self._order:
            self._rebuild()

    def _rebuild(self) -> None:
        """Re-bucket in the gradient-ready order rank 0 observed, so early gradients share early buckets."""
        self.rebuild_pending = False
        order = self._order or []
        self._order = None
        seen = set(order)
        order = order + [i for i in reversed(range(len(self.params))) if i not in seen]
        device = self.params[0].device if self.params[0].device.type == "cuda" else torch.device("cpu")
        order_t = torch.tensor(order, dtype=torch.int64, device=device)
        dist.broadcast(order_t, src=dist.get_global_rank(self.primary_group, 0), group=self.primary_group)
        self.layout_order = order_t.tolist()
        self.relayout(self.cap_bytes, self.first_cap_bytes)

    def relayout(self, cap_bytes: int | list[int], first_cap_bytes: int) -> None:
        """Lay the buckets out again at these caps, in ``layout_order``; between iterations only, and with no message:
        every rank calls it at the same iteration (``bucket_cap_mb="auto"``)."""
        self.cap_bytes, self.first_cap_bytes = cap_bytes, first_cap_bytes
        old_views = self.views
        if not self.as_view:  # nothing lives in the old buckets between iterations: free them first (like torch)
            old_views = self.views = self.flats = self._bucket_views = self._deferred_views = self._deferred_runs = None  # type: ignore
        self._build(assign_buckets(self.specs, cap_bytes, first_cap_bytes, self.layout_order))
        if self.as_view:  # .grad still points into the old buckets: move it into the new ones
            for p, old, new in zip(self.params, old_views, self.views):
                if p.grad is not None and p.grad.data_ptr() == old.data_ptr():
                    new.copy_(old)
                    p.grad = new

    # ---- filling (the reducer's item 2) ----------------------------------------------------------------
    def _fill(self, b: int) -> None:
        """Bucket ``b``'s small gradients, once all are final, into its flat tensor, averaged unless a comm hook
        averages: one fused copy, then one multiply per stretch of the bucket holding only small gradients, not a
        kernel each (the host issuing kernels is the bottleneck on a fast GPU; on CPU a fused multiply still runs
        one kernel per tensor). Bitwise torch's average: the same multiply by 1 / world size."""
        params = self._deferred_params[b]
        if not params:
            return
        scale = self._scale if self.comm_hook is None else None
        if len(params) == 1:  # one small gradient: one multiply into the bucket, not a fused copy and multiply
            self._fill_one(self._deferred[b][0], params[0].grad, scale)
            return
        grads = [p.grad for p in params]
        if self.as_view or any(g is None or g.requires_grad or g.is_sparse for g in grads):
            for i, grad in zip(self._deferred[b], grads):
                self._fill_one(i, grad, scale)
            return
        torch._foreach_copy_(self._deferred_views[b], grads)
        if scale is not None:
            torch._foreach_mul_(self._deferred_runs[b], scale)

    def _fill_one(self, i: int, grad: torch.Tensor | None, scale: float | None) -> None:
        """One gradient into its bucket, averaged unless a comm hook averages: a large one as soon as it is final, a
        bucket's only small one, and the rarer cases (none yet, sparse, ``create_graph``, ``.grad`` as a view)."""
        view = self.views[i]
        if grad is None:
            view.zero_()
        elif grad.is_sparse:
            raise RuntimeError(
                f"parameter {self.names[i]} has a sparse gradient, which this DDP does not support; "
                "use a dense embedding (sparse=False) or torch's DistributedDataParallel"
            )
        else:
            if grad.requires_grad:  # backward(create_graph=True): average the values, not the graph (as torch)
                self._warn_create_graph()
                grad = grad.detach()
            if scale is not None:
                scale = self._factors.get(grad.dtype, scale)
            if self.as_view and grad.data_ptr() == view.data_ptr():
                if scale is not None:
                    grad.mul_(scale)
            else:
                if scale is not None:
                    torch.mul(grad, scale, out=view)
                else:
                    view.copy_(grad)
                if self.as_view:
                    self.params[i].grad = view

    def _warn_create_graph(self) -> None:
        if not self._warned_create_graph:
            self._warned_create_graph = True
            warnings.warn(
                "DistributedDataParallel with backward(create_graph=True): gradients are averaged "
                "across ranks, but higher-order gradients are not synchronized (as in torch's DDP)",
                stacklevel=3,
            )
