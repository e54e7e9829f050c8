"""Uneven inputs: ``DistributedDataParallel.join()``, on torch's generic Join protocol.

A rank that runs out of batches leaves its loop and waits in ``Join.__exit__``. While any rank still trains,
each of its iterations is mirrored, collective for collective, so that nobody hangs:

  still training (``announce``, at each forward)   joined (``DDPJoinHook.main_hook``, once per such iteration)
  1. "not joined": 1 to torch's Join count          the count's 0 (Join does this itself)
  2. "this iteration reduces gradients": 1 or 0     0; reads whether anyone sends 1
  3. bucket rebuild, buffer broadcast as usual      the same (the buffers' source: the highest training rank)
  4. backward: one allreduce per bucket, in order   an allreduce of zeros per bucket (and the usage bitmap)

So a joined rank adds nothing to the sum, which is divided by the initial world size (the default) or, with
``divide_by_initial_world_size=False``, by the number of ranks still training. When all have joined, the
highest rank among the last to join broadcasts its parameters (and buffers, unless ``forward_sync_buffers``
is False) to every rank, so all leave with the same model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from .broadcast import broadcast_coalesced


def announce(ddp, sync: bool) -> None:
    """Steps 1-2 on a rank still training, before its forward's collectives; sets this iteration's average."""
    Join.notify_join_context(ddp)  # step 1, when ddp is the first joinable of an enabled Join
    flag = torch.tensor([1.0 if sync else 0.0], device=ddp.join_device)
    work = dist.all_reduce(flag, group=ddp.join_process_group, async_op=True)
    if sync and not ddp._divide_by_initial_world_size:  # every rank still training sends 1 when it reduces
        work.wait()
        ddp.reducer.set_divisor(int(flag.item()))
    else:
        ddp._join_flag = flag, work  # not waited for: kept alive until the next forward
        ddp.reducer.set_divisor(ddp.world_size)


def common_rank(ddp, candidate: bool) -> int:
    """The highest rank (in the DDP's group) among those for which ``candidate`` holds."""
    rank = torch.tensor([dist.get_rank(ddp.join_process_group) if candidate else -1], device=ddp.join_device)
    dist.all_reduce(rank, op=dist.ReduceOp.MAX, group=ddp.join_process_group)
    return int(rank.item())


class DDPJoinHook(JoinHook):
    def __init__(self, ddp, divide_by_initial_world_size: bool):
        super().__init__()
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size

    def main_hook(self) -> None:
        """Steps 2-4 on a joined rank, for one iteration of the ranks still training."""
        ddp, reducer = self.ddp, self.ddp.reducer
        flag = torch.zeros(1, device=ddp.join_device)
        dist.all_reduce(flag, group=ddp.join_process_group)
        sync = flag.item() > 0
        if sync:
            reducer.rebuild_if_pending()
        ddp._sync_buffers(joined=True)
        ddp._sync_buffers_now = sync
        if sync:
            reducer.reduce_zeros()

    def post_hook(self, is_last_joiner: bool) -> None:
        ddp = self.ddp
        states = [p.detach() for p in ddp.module.parameters()]
        if ddp.forward_sync_buffers:
            states += [b.detach() for b in ddp.module.buffers()]
        broadcast_coalesced(states, ddp.join_process_group, src=common_rank(ddp, is_last_joiner))


class JoinableDDP(Joinable):
    """DDP's side of torch's Join protocol: the ``join()`` context and what a joined rank runs."""

    def join(
        self, divide_by_initial_world_size: bool = True, enable: bool = True, throw_on_early_termination: bool = False
    ) -> Join:
        """A context in which ranks may run different numbers of iterations (torch's API; ``ddp_impl.join``).

        Args:
            divide_by_initial_world_size: average over every rank (``True``) or over those still training.
            enable: ``False`` makes the context a no-op.
            throw_on_early_termination: raise on every rank once one has run out of inputs, instead of shadowing it.

        Note:
            Inside it every forward costs two small extra allreduces.

        Example::

            >>> with model.join():
            ...     for batch in my_shard:  # as many batches as this rank has
            ...         model(batch).sum().backward()
        """
        if enable and self.static_graph and self.reducer.static_graph_pending:
            raise RuntimeError(
                "join() with static_graph=True needs one synchronized iteration on every rank "
                "before the join context (the first iteration learns the graph)"
            )
        return Join(
            [self], enable, throw_on_early_termination, divide_by_initial_world_size=divide_by_initial_world_size
        )

    def join_hook(self, **kwargs) -> DDPJoinHook:
        """Joinable's API: what a joined rank runs while others still train (``Join([model, optimizer])``). Every rank
        builds its join context at the same point, so a bucket-cap search settles here, where every rank is."""
        if self._tuner is not None:
            from . import autotune

            autotune.stop(self, "stopped by a join context")
        return DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.reducer.params[0].device

    @property
    def join_process_group(self):
        return self._primary
