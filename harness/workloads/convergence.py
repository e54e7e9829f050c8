"""Train on real data with our DDP and record how fast it converges (paper Figure 11, Section 5.4).

One rank's loop for one :class:`~harness.config.ConvergenceConfig` point:

1. Load the data set (:mod:`harness.workloads.data`) and build the model with the same seed on every rank: a small MLP
   (64 -> 128 -> 10) for ``digits``, a small CNN for ``cifar10``. Wrap it in ``ddp_impl``'s
   DistributedDataParallel (rank 0's weights are broadcast) and use SGD with momentum.
2. Iteration ``i`` is one forward/backward of one per-rank batch from this rank's shard of a seeded per-epoch
   shuffle. With ``sync_every = n`` it synchronizes when ``(i + 1) % n == 0``; the other n-1 iterations run
   inside ``no_sync()`` and their gradients accumulate locally (summed, as in torch: the loss is not divided by
   n). The optimizer steps, and gradients are zeroed, only on synchronized iterations, so the parameters stay
   identical on every rank.
3. Every rank records its iteration's training loss and batch accuracy. Rank 0 also evaluates the held-out
   test split (loss and accuracy, ``torch.no_grad``, model in eval mode) after every ``eval_every``-th
   iteration and after the last one; other rows leave ``test_loss`` / ``test_accuracy`` empty.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from harness.config import ConvergenceConfig
from harness.launch.faults import inject_fault
from harness.launch.spawn import RankContext
from harness.workloads.data import Dataset, batch_indices, load_dataset
from harness.workloads.runner import rank_metadata

EVAL_BATCH = 2048  # test samples per forward when evaluating


def build_convergence_model(data: Dataset) -> nn.Module:
    """MLP for flat features (digits), small CNN for images (CIFAR-10). Seed torch first for equal weights."""
    if len(data.input_shape) == 1:
        return nn.Sequential(nn.Linear(data.input_shape[0], 128), nn.ReLU(), nn.Linear(128, data.num_classes))
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, data.num_classes),
    )


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on the whole test split."""
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, data.test_size, EVAL_BATCH):
        x = data.inputs(data.x_test[start : start + EVAL_BATCH]).to(device)
        y = data.y_test[start : start + EVAL_BATCH].to(device)
        out = model(x)
        loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(dim=1) == y).sum())
    model.train()
    return loss_sum / data.test_size, correct / data.test_size


def run_convergence_point(ctx: RankContext, cfg: ConvergenceConfig) -> list[dict]:
    """Train ``cfg.iters`` iterations on this rank; one row per iteration (see the module docstring)."""
    from ddp_impl import DistributedDataParallel  # lazily, like harness.workloads.runner

    inject_fault(cfg.fault, ctx.rank)
    data = load_dataset(cfg.dataset, cfg.data_dir, cfg.test_fraction, cfg.seed)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    local = build_convergence_model(data).to(ctx.device)
    num_params = sum(p.numel() for p in local.parameters())
    model = DistributedDataParallel(local, process_group=ctx.group, bucket_cap_mb=cfg.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    batches = batch_indices(data.train_size, ctx.world_size, ctx.rank, cfg.batch_size, cfg.seed)
    meta = dict(
        rank_metadata(ctx),
        num_params=num_params,
        batch_size_used=cfg.batch_size,
        train_size=data.train_size,
        test_size=data.test_size,
    )
    rows = []
    for it in range(cfg.iters):
        idx, epoch = next(batches)
        x, y = data.inputs(data.x_train[idx]).to(ctx.device), data.y_train[idx].to(ctx.device)
        synced = (it + 1) % cfg.sync_every == 0
        with contextlib.nullcontext() if synced else model.no_sync():
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
        if synced:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        row = dict(
            meta,
            iteration=it,
            synced=synced,
            epoch=epoch,
            loss=float(loss.detach()),
            accuracy=float((out.detach().argmax(dim=1) == y).float().mean()),
            test_loss=math.nan,
            test_accuracy=math.nan,
        )
        if ctx.rank == 0 and ((it + 1) % cfg.eval_every == 0 or it == cfg.iters - 1):
            # the local module, not the DDP wrapper: rank 0 alone must not touch DDP's collective state
            row["test_loss"], row["test_accuracy"] = evaluate(local, data, ctx.device)
        rows.append(row)  # a diverging run is kept (loss inf/nan): it is a result, not a failure
    return rows
