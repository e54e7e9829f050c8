"""A user's own script, as torch's tutorials and a systems course's DDP tests end one: ``torch.multiprocessing.spawn``
2 Gloo ranks, wrap, train 5 steps at a cap giving several buckets, then end in one of ``ENDINGS``. Each rank prints
``LEFT_MARK`` and the Gloo threads still running at its very end (an ``atexit`` handler registered before any
other, so it runs last): a thread left there is what can abort a process at exit.

    python tests/ddp_impl/exit_script.py ours|torch destroy|drop|none|cycle|global
"""

import atexit
import datetime
import gc
import os
import socket
import sys

LEFT_MARK = "gloo threads alive at exit:"
# destroy: barrier and destroy_process_group() with the model alive; drop: the model dropped first; none: both left
# to the interpreter's exit; cycle: the model in a reference cycle (the collector off: it lives until the exit);
# global: the model kept in a global, as a script written at module level keeps it
ENDINGS = ("destroy", "drop", "none", "cycle", "global")
KEPT = []


def _gloo_threads() -> list[str]:
    """As ``harness.launch.groups.gloo_threads``, which cannot be imported here: importing harness imports ddp_impl,
    whose exit handler must be registered after this script's report."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return sorted(n for n in names if n.startswith(("pt_gloo", "gloo")))


def _report_left() -> None:
    left = _gloo_threads()
    if left:
        print(LEFT_MARK, left, file=sys.stderr, flush=True)


if __name__ in ("__main__", "__mp_main__"):  # the script and its spawned ranks, not a test importing its names
    atexit.register(_report_left)  # first registered, last run: after ddp_impl's own exit handler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import ddp_impl  # noqa: E402


def worker(rank: int, world_size: int, port: int, impl: str, ending: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])
    wrap = ddp_impl.DistributedDataParallel if impl == "ours" else torch.nn.parallel.DistributedDataParallel
    ddp = wrap(model, bucket_cap_mb=0.005)  # about 4 KiB a bucket: a few buckets
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)  # imports torch._dynamo, which pins the group
    for _ in range(5):
        optimizer.zero_grad()
        ddp(torch.randn(8, 32)).sum().backward()
        optimizer.step()
    if ending == "cycle":
        gc.disable()
        ddp.itself = [ddp]
    if ending == "global":
        KEPT.append(ddp)
    if ending == "drop":
        del ddp, optimizer, model
    if ending != "none":
        dist.barrier()
        dist.destroy_process_group()


def main(impl: str, ending: str) -> None:
    if impl not in ("ours", "torch") or ending not in ENDINGS:
        sys.exit(f"usage: exit_script.py ours|torch {'|'.join(ENDINGS)}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, impl, ending), nprocs=2)


if __name__ == "__main__":
    main(*sys.argv[1:3])
