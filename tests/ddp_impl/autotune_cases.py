"""Per-rank bodies of test_autotune: ours with ``bucket_cap_mb="auto"`` trained beside torch's DDP at its default cap
for longer than the search runs, so every layout the search tries and the settled one are compared. Spawned ranks
import this module."""

from __future__ import annotations

import io
from copy import deepcopy

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join

from ddp_impl import DistributedDataParallel as OurDDP
from ddp_impl import RoundRobinProcessGroup
from experiments.parity import compare_with

STEPS = 36  # past the search's budget of 30 synchronized iterations
PRIOR = (0.0, 0.001)  # on these small models: one bucket per parameter, 1 KiB buckets; the default is one bucket


def _case(rank, ours_kwargs, torch_kwargs, model, accum=1, dtype=torch.float64, torch_hook=None):
    """(max relative error of gradients and final state against torch's DDP, ours's result, caps tried)."""
    ours = dict(bucket_cap_mb="auto", autotune_prior_mb=PRIOR, **ours_kwargs)
    error, ddp = compare_with(rank, ours, torch_kwargs, model, accum, torch_hook, dtype, steps=STEPS)
    return error, ddp.autotune_result, sorted({t["cap_mb"] for t in ddp.autotune_log})


def equal_to_torch_while_tuning(ctx):
    rank = ctx.rank
    rr = RoundRobinProcessGroup.new(2)
    return {
        "convnet": _case(rank, {}, {}, "convnet"),
        "gradient_as_bucket_view": _case(
            rank, dict(gradient_as_bucket_view=True), dict(gradient_as_bucket_view=True), "convnet"
        ),
        "no_sync accum=2": _case(rank, {}, {}, "convnet", accum=2),
        "find_unused": _case(
            rank, dict(find_unused_parameters=True), dict(find_unused_parameters=True), "branchy", accum=2
        ),
        "static_graph": _case(rank, dict(static_graph=True), dict(static_graph=True), "convnet"),
        "round robin k=2": _case(rank, dict(process_group=rr), {}, "convnet"),
        "fp16 hook": _case(
            rank, dict(comm_hook="fp16"), {}, "mlp", dtype=torch.float32, torch_hook=default_hooks.fp16_compress_hook
        ),
    }


def stopped_by_join(ctx):
    """Five synchronized iterations of tuning, then uneven inputs under a join context: the search stops where
    every rank is, and training goes on to the end without a hang."""
    torch.manual_seed(0)
    model = OurDDP(torch.nn.Linear(8, 8).double(), bucket_cap_mb="auto", autotune_prior_mb=PRIOR)
    x = torch.randn(4, 8, dtype=torch.float64)
    for _ in range(5):
        model(x).sum().backward()
    with Join([model]):
        for _ in range(3 + 2 * ctx.rank):
            model(x).sum().backward()
    return model.autotune_result, len(model.autotune_log)


def stray_forward_and_copies(ctx):
    """Mid-search: rank 0 alone runs a forward with no backward (a metric computed with grad on), then both ranks
    copy the model (deepcopy, torch.save): the ranks still agree, the copies start a search of their own."""
    torch.manual_seed(0)
    model = OurDDP(torch.nn.Linear(8, 8).double(), bucket_cap_mb="auto", autotune_prior_mb=PRIOR)
    x = torch.randn(4, 8, dtype=torch.float64)
    for i in range(40):
        if i in (4, 9) and ctx.rank == 0:
            model(x)  # no backward: not a step of the search
        model(x).sum().backward()
        if i == 6:
            copy, saved = deepcopy(model), io.BytesIO()
            torch.save(model, saved)
            copied = (copy.bucket_cap_mb_now, copy.autotune_log, copy._tuner is not None, saved.tell() > 0)
    return model.autotune_result, model.autotune_log, copied
