"""A multi-host smoke test: train a small model with our DDP on every rank of a torchrun job, then check that
every rank ends with the same parameters and write them, so a run on H hosts can be compared with one host.

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST0:29400 --rdzv-id=smoke \\
        --local-addr=THIS_HOST_ADDRESS --rdzv-conf=is_host=1 (on HOST0; 0 elsewhere) \\
        -m harness.workloads.smoke --out=smoke.pt

Every rank trains on its own seeded batches (seeded by global rank, so the job's result depends only on the
world size, not on how ranks are spread over hosts). Rank 0 writes the final ``state_dict`` to ``--out`` and
prints one JSON line (world size, hosts, a checksum of the parameters). Exit status 1 if ranks' parameters
disagree.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist

from harness.cli import OneLineParser
from harness.launch.groups import end_rank, init_in_place
from harness.workloads.models import SmallNet


def train(iters: int, backend: str, timeout_s: float) -> tuple[dict, dict]:
    init_in_place(backend, timeout_s)
    from ddp_impl import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    model = DistributedDataParallel(SmallNet().to(device), bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(iters):
        x = torch.randn(8, 3, 16, 16, generator=gen).to(device)
        y = torch.randint(0, 10, (8,), generator=gen).to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
    # parameters only: BatchNorm's running statistics are broadcast from rank 0 before each forward, then each
    # rank updates them with its own batch, so they differ between ranks after training (as with torch's DDP)
    mine = torch.stack([p.detach().double().sum() for p in model.module.parameters()]).sum().item()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (mine, socket.gethostname(), os.environ.get("GLOO_SOCKET_IFNAME", "")))
    summary = dict(
        world_size=world,
        checksum=mine,
        ranks_agree=len({c for c, _, _ in everyone}) == 1,
        hosts=sorted({h for _, h, _ in everyone}),
        interfaces=sorted({i for _, _, i in everyone}),
    )
    return state, summary


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m harness.workloads.smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=5, help="training iterations (default: 5)")
    parser.add_argument(
        "--backend", default="gloo", choices=("gloo", "nccl"), help="process group backend (default: gloo)"
    )
    parser.add_argument("--timeout_s", type=float, default=60.0, help="process group timeout in seconds (default: 60)")
    parser.add_argument(
        "--out", default="", help="rank 0 writes the final state_dict here (torch.save; default: nothing written)"
    )
    ns = parser.parse_args(argv)
    if ns.iters < 1:
        parser.error(f"--iters={ns.iters}: give at least 1")
    if not ns.timeout_s > 0:
        parser.error(f"--timeout_s={ns.timeout_s}: give a positive number of seconds")
    if "RANK" not in os.environ:
        parser.error("run under torchrun (RANK is not set)")
    state, summary = train(ns.iters, ns.backend, ns.timeout_s)
    if dist.get_rank() == 0:
        if ns.out:
            torch.save(state, ns.out)
        print(json.dumps(summary), flush=True)
    end_rank()  # the barrier, then the group torn down while Python is whole (not left to the exit: an abort)
    return 0 if summary["ranks_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
