"""The data-parallel systems the suite times side by side, each built by :func:`build` into the same three calls
(forward on ``model``, ``backward(loss)``, ``optimizer.step()`` + ``zero_grad``), so one loop times them all.

========================  ===============================================================================
impl                      what runs on each rank
========================  ===============================================================================
``local``                 the model alone: no data parallelism (the 1-rank control; no communication)
``ours`` / ``torch``      ddp_impl's / torch's DistributedDataParallel
``zero1``                 torch's DDP + ``ZeroRedundancyOptimizer``: optimizer state sharded (ZeRO-1)
``fsdp``                  torch FSDP2 ``fully_shard`` per block and at the root: parameters, gradients and
                          optimizer state sharded, parameters re-sharded after forward (ZeRO-3)
``fsdp_keep``             FSDP2 with ``reshard_after_forward=False``: parameters kept from forward to
                          backward, so one all-gather per iteration (ZeRO-2-like)
``deepspeed1/2/3``        DeepSpeed's engine with ZeRO stage 1, 2 or 3 (``DS_ACCELERATOR=cpu`` without a GPU)
``threads``               one process, ``replicas`` copies of the model: ``nn.DataParallel`` on GPUs; on CPU,
                          where ``nn.DataParallel`` only calls the module, :class:`ThreadReplicas` (its design
                          on threads). Runs at world size 1.
========================  ===============================================================================

Every system gets the same optimizer (``optimizer``: SGD or Adam, torch's own) and, with ``checkpointing``, the
same activation checkpointing (non-reentrant, per block). A *block* is an element of an ``nn.Sequential`` or
``nn.ModuleList`` holding parameters, outermost first (ResNet's bottlenecks, BERT's layers): FSDP shards per
block and checkpointing recomputes per block.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ddp_impl import DistributedDataParallel, RoundRobinProcessGroup
from ddp_impl.comm_hooks import resolve
from ddp_impl.options import DEFAULT_BUCKET_CAP_MB, MIB, DDPOptions
from harness.launch.spawn import RankContext
from harness.workloads.blocks import blocks, checkpoint_blocks
from harness.workloads.thread_replicas import ThreadReplicas

DDP_IMPLS = ("ours", "torch")
ZERO_IMPLS = ("zero1", "fsdp", "fsdp_keep", "deepspeed1", "deepspeed2", "deepspeed3")
IMPLS = ("local", *DDP_IMPLS, *ZERO_IMPLS, "threads")


def wrap(model: nn.Module, impl: str, ctx: RankContext, options: DDPOptions, round_robin_groups: int = 1) -> nn.Module:
    """``model`` in torch's DDP (``impl="torch"``), ours (``"ours"``) or as is (``"local"``), on the rank's
    group: one construction for the sweeps and the bench, so both measure the same DDPs. Ours takes ``options``
    whole; torch's DDP takes the cap, the view, the hook and ``init_sync`` (it always overlaps, and its timing is
    its own logger). ``round_robin_groups > 1`` gives ours that many process groups used in turn."""
    if impl == "local":
        return model
    if impl == "torch":
        ddp = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            process_group=ctx.group,
            bucket_cap_mb=options.bucket_cap_mb,
            gradient_as_bucket_view=options.gradient_as_bucket_view,
            init_sync=options.init_sync,
        )
        if options.comm_hook:  # torch's own hook by ddp_impl's short name
            ddp.register_comm_hook(ddp.process_group, resolve(options.comm_hook))
        return ddp
    group = ctx.group
    if round_robin_groups > 1:
        group = RoundRobinProcessGroup.new(round_robin_groups, timeout=datetime.timedelta(seconds=ctx.timeout_s))
    return DistributedDataParallel(model, process_group=group, **options.kwargs())


def same_on_every_rank(model: nn.Module, ctx: RankContext) -> bool:
    """Whether every rank's ``model`` holds the same parameters and buffers, by one small all-reduce of a
    fingerprint (each tensor's float64 sum, in order). Where it does, DDP's broadcast at construction changes
    nothing and is skipped: BERT-base's 440 MB take about a second a point at ``make fig7``'s emulated 3.7 Gbit/s."""
    if ctx.world_size == 1:
        return True
    import torch.distributed as dist

    tensors = [*model.parameters(), *model.buffers()]
    mine = (
        torch.stack([t.detach().sum(dtype=torch.float64) for t in tensors])
        if tensors
        else torch.zeros(1, dtype=torch.float64, device=ctx.device)
    )
    spread = torch.cat([mine, -mine])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=ctx.group)
    high, low = spread.chunk(2)
    return bool(torch.equal(high, -low))


@dataclass
class Trainer:
    """What the timing loop calls: forward on ``model``, ``backward(loss)``, then ``optimizer.step()`` and
    ``optimizer.zero_grad(set_to_none=False)``."""

    model: nn.Module
    optimizer: object
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward


OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    return OPTIMIZERS[name](params, lr=lr)


def build(
    model: nn.Module,
    ctx: RankContext,
    *,
    impl: str,
    optimizer: str = "sgd",
    lr: float = 0.01,
    checkpointing: bool = False,
    replicas: int = 1,
    ddp: DDPOptions = DDPOptions(bucket_cap_mb=DEFAULT_BUCKET_CAP_MB),
    round_robin_groups: int = 1,
) -> Trainer:
    """``model`` (the same weights on every rank) made into ``impl``'s trainer on the rank's group. ``ddp`` goes
    to :func:`wrap` for ours and torch's DDP (ZeRO-1 included), and its cap to DeepSpeed's reduce/gather buckets;
    its ``init_sync`` is decided here: a DDP broadcasts the model at construction only where ranks' weights differ."""
    if checkpointing:
        checkpoint_blocks(model)
    if impl in ("torch", "ours", "zero1"):
        ddp = dataclasses.replace(ddp, init_sync=not same_on_every_rank(model, ctx))
    if impl in ("local", *DDP_IMPLS):
        model = wrap(model, impl, ctx, ddp, round_robin_groups)
        return Trainer(model, make_optimizer(optimizer, model.parameters(), lr))
    if impl == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        model = wrap(model, "torch", ctx, ddp)
        return Trainer(
            model,
            ZeroRedundancyOptimizer(
                model.parameters(), optimizer_class=OPTIMIZERS[optimizer], lr=lr, process_group=ctx.group
            ),
        )
    if impl == "threads":
        if ctx.device.type == "cuda":
            model = nn.DataParallel(model, device_ids=list(range(replicas)))
            return Trainer(model, make_optimizer(optimizer, model.parameters(), lr))
        model = ThreadReplicas(model, replicas)
        return Trainer(model, make_optimizer(optimizer, model.parameters(), lr), backward=model.backward)
    if impl in ("fsdp", "fsdp_keep"):
        return _fsdp(model, ctx, optimizer, lr, reshard=impl == "fsdp")
    if impl.startswith("deepspeed"):
        cap_mb = DEFAULT_BUCKET_CAP_MB if ddp.bucket_cap_mb is None else ddp.bucket_cap_mb
        return _deepspeed(model, ctx, optimizer, lr, stage=int(impl[-1]), bucket_cap_mb=cap_mb)
    raise ValueError(f"unknown impl {impl!r}; choose one of {list(IMPLS)}")


def _fsdp(model: nn.Module, ctx: RankContext, optimizer: str, lr: float, reshard: bool) -> Trainer:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(ctx.group or dist.group.WORLD, ctx.device.type)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return Trainer(model, make_optimizer(optimizer, model.parameters(), lr))


class _EngineStep:
    """DeepSpeed's ``engine.step()`` (optimizer step and zeroing) behind the optimizer calls the loop makes."""

    def __init__(self, engine):
        self.engine = engine

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = False) -> None:
        pass  # engine.step() already zeroed the gradients


def _deepspeed(
    model: nn.Module, ctx: RankContext, optimizer: str, lr: float, stage: int, bucket_cap_mb: float
) -> Trainer:
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if ctx.device.type == "cuda" else "cpu")
    import deepspeed

    bucket = max(1, int(bucket_cap_mb * MIB / 4))  # elements; DeepSpeed's default (5e8) would allocate 2 GB
    zero = {"stage": stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if stage == 3:
        zero = {"stage": 3, "reduce_bucket_size": bucket, "stage3_prefetch_bucket_size": bucket}
    # gradient_clipping: DeepSpeed 0.19.8 clips the gradients' global norm to 1.0 unless told otherwise; DDP does not
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model.to(ctx.device),
        config=config,
        dist_init_required=False,
        optimizer=make_optimizer(optimizer, model.parameters(), lr),
    )
    return Trainer(engine, _EngineStep(engine), backward=engine.backward)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _torch_optimizer(trainer: Trainer) -> torch.optim.Optimizer:
    """The torch optimizer that holds the state: inside ZeRO-1 (``optim``) or DeepSpeed's ZeRO (``optimizer``)."""
    opt = trainer.optimizer.engine.optimizer if isinstance(trainer.optimizer, _EngineStep) else trainer.optimizer
    while hasattr(opt, "optim") or not isinstance(opt, torch.optim.Optimizer):
        opt = getattr(opt, "optim", None) or opt.optimizer
    return opt


def state_tensors(trainer: Trainer) -> dict[str, list[torch.Tensor]]:
    """The rank's own parameters, gradients and optimizer state (its shards, where sharded), found from the
    system's objects rather than by the profiler: DeepSpeed's partitions (``ds_tensor``), DTensors' local shards,
    the state of the torch optimizer inside ZeRO-1 or DeepSpeed, and that optimizer's own copies of the
    parameters (DeepSpeed's flat fp32 partitions) counted as optimizer state, as ZeRO counts master weights,
    their gradients as gradients."""
    params = [_local(getattr(p, "ds_tensor", p)) for p in trainer.model.parameters()]
    grads = [_local(p.grad) for p in trainer.model.parameters() if p.grad is not None]
    inner = _torch_optimizer(trainer)
    mine = {p.untyped_storage().data_ptr() for p in params}
    copies = [p for g in inner.param_groups for p in g["params"] if _local(p).untyped_storage().data_ptr() not in mine]
    state = [_local(v) for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": params,
        "gradients": grads + [_local(p.grad) for p in copies if p.grad is not None],
        "optimizer_state": state + [_local(p) for p in copies],
    }
