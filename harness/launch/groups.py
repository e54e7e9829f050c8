"""How a rank joins and leaves its process groups, spawned or started by torchrun/SLURM: the default group created
so that torch cannot pin it (:func:`init_default_group`), and every group destroyed while the interpreter is whole
(:func:`end_rank`), because one left to the interpreter's exit can abort the process after its work was stored."""

from __future__ import annotations

import atexit
import datetime
import functools
import gc
import os
import sys

import torch
import torch.distributed as dist

from ddp_impl.lifetime import exiting_on_exception


def init_default_group(backend: str, timeout: datetime.timedelta, **how) -> None:
    """``dist.init_process_group`` (``how``: its rendezvous), with ``torch.distributed.nn.functional`` imported first.
    That module's collectives take ``group=group.WORLD`` as a default argument, evaluated when it is first imported,
    and torch imports it with ``torch._dynamo`` (creating an optimizer does). Imported while a group exists, it
    holds that group for good: ``destroy_process_group()`` cannot free it and its Gloo threads live on into the
    interpreter's exit (:func:`end_rank`). Imported before any group, the defaults are None."""
    import torch.distributed.nn.functional  # noqa: F401

    dist.init_process_group(backend, timeout=timeout, **how)


def gloo_threads() -> list[str]:
    """The names of this process's threads that a Gloo process group runs (its worker threads, ``pt_gloo_runloop``,
    and its transport's I/O loop, ``gloo_tcp_loop``); none once every group is destroyed. Linux only (else [])."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return []
    names = []
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended while we looked
            continue
    return sorted(n for n in names if n.startswith(("pt_gloo", "gloo")))


def end_rank(failed: bool = False) -> list[str]:
    """How every rank leaves its process groups, spawned (its :class:`RankPool` closing) or started by torchrun/SLURM
    (at exit: :func:`init_in_place` registers it), while the interpreter is still whole:

    1. a barrier (with the group's timeout), so no peer is still in a collective with this rank;
    2. ``destroy_process_group()``, then a garbage collection (a model in a reference cycle may hold a group), so
       the groups' last references drop here: ProcessGroupGloo waits for its queued work and joins its worker
       threads and Gloo's I/O thread (given :func:`init_default_group`, which keeps torch from pinning the group).

    Why: a group left to the interpreter's exit keeps those threads running while Python finalizes. A worker
    releasing a finished collective's tensors drops their Python objects and so takes the GIL; during
    finalization CPython ends such a thread with ``pthread_exit``, whose unwinding meets the noexcept
    ``~AsyncWork``: ``terminate called without an active exception``, SIGABRT, after the work was done and stored
    (a race, seen under load; torchrun then tears the job down). Returns the Gloo threads still running: none,
    unless something still holds a group (said on stderr).

    ``failed``: a rank failed (a peer may be dead, or stuck in a collective with this one): neither step runs, as
    the barrier would wait out the timeout and destroying waits for the stuck collectives. The process leaves its
    groups to its exit; it has failed already, and that failure is what its pool or launcher reports."""
    if failed or not dist.is_initialized():
        return gloo_threads()
    rank = dist.get_rank()
    try:
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()
    except Exception as exc:  # noqa: BLE001 - a peer died at the very end: its own failure tells why
        print(
            f"[harness] rank {rank}: the final barrier failed ({str(exc).splitlines()[0][:200]}); destroying "
            f"the groups without it",
            file=sys.stderr,
            flush=True,
        )
    dist.destroy_process_group()
    gc.collect()
    left = gloo_threads()
    if left:
        print(
            f"[harness] rank {rank}: Gloo threads {left} still run after destroy_process_group(): something still "
            f"holds a process group, and the process may abort at exit",
            file=sys.stderr,
            flush=True,
        )
    return left


def init_in_place(backend: str, timeout_s: float) -> None:
    """Create the default process group from env:// if not yet there (torchrun / SLURM path); the rank ends it
    by :func:`end_rank` when the process exits."""
    if not dist.is_initialized():
        _end_rank_at_exit()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "mpi":  # MPI knows its ranks; it takes no rendezvous
            init_default_group("mpi", timeout)
        else:
            init_default_group(backend, timeout, init_method="env://")


@functools.cache
def _end_rank_at_exit() -> None:
    """Register :func:`end_rank` with ``atexit`` (once): it runs after the program's last line, so after rank 0 has
    stored its results, and before the interpreter finalizes."""
    atexit.register(_end_rank_unless_failing)


def _end_rank_unless_failing() -> None:
    """A process leaving on an uncaught exception has failed (``end_rank(failed=True)``)."""
    end_rank(failed=exiting_on_exception())
