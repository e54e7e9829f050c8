"""Run a function on ``world_size`` ranks: spawned here, or in place under torchrun.

``launch(fn, world_size, backend, args=...)`` calls ``fn(ctx, *args)`` on every rank with a
:class:`RankContext` and returns the per-rank return values, indexed by rank.

* Spawned (RANK not set): one process per rank on this machine, forked from a server that has imported torch
  once (``forkserver``; ``spawn`` on a CUDA machine and for settings read at process start). The parent hosts
  the rendezvous TCPStore on a kernel-chosen free port, so there is no port race. Each rank puts its result
  or traceback on a queue; the parent fails the launch (and terminates the other ranks) as soon as one rank
  reports an error or dies without reporting, so a crashed rank never hangs the parent. A :class:`RankPool`
  keeps such ranks alive for many launches (a sweep's points): ``launch`` is a pool used once.
* In place (RANK set, e.g. ``torchrun``/SLURM): env:// rendezvous (RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR/PORT); ``fn`` runs in this process and results are all-gathered, so every rank gets the list.
  The default process group is created once and reused by later launches in the same job.
* Emulated network: :class:`harness.netem.NamespacePool` keeps a :class:`RankPool` inside a private network
  namespace (the sweep picks it for points with a ``net``); this module knows nothing of it.

Every process group gets ``timeout_s``, so a collective waiting on a hung or dead peer raises instead of
blocking forever. Every rank, spawned or in place, ends by :func:`end_rank`: a barrier, then its process groups
destroyed while the interpreter is whole (spawned ranks when their pool closes, torchrun/SLURM ranks at exit).
Threads: each rank uses ``max(1, cores // ranks_on_this_node)`` unless told otherwise, and records it in
``ctx.num_threads``. NCCL ranks use GPU ``local_rank``.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import faulthandler
import functools
import gc
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from harness import env

BACKENDS = ("gloo", "nccl", "mpi")
# glibc's allocator in spawned ranks (read once, at process start). "retain": freed memory stays in the process for
# reuse, as CUDA's caching allocator keeps it on a GPU; with glibc's defaults a big block freed and allocated again
# in every iteration is faulted in page by page each time (BERT-base's backward: 0 to 130k faults, 410 to 650 ms,
# depending on the heap's history).
MALLOC_ENV = {"default": {}, "retain": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)}}

# What the fork server imports once for every rank it starts (each rank would otherwise pay torch's import, seconds
# of a small machine's CPU). Nothing here may touch CUDA: a forked process cannot use a CUDA its parent set up.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch.distributed.nn.functional", "harness.runner"]


def start_method(rank_env: dict) -> multiprocessing.context.BaseContext:
    """``forkserver`` where it is safe, else ``spawn``: with CUDA (kept out of forked ranks altogether) and when
    the ranks get settings that a process reads once as it starts (glibc's allocator, c10's log level), which a
    fork of the server would not see."""
    if rank_env or "forkserver" not in multiprocessing.get_all_start_methods() or torch.cuda.is_available():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context


class _LauncherStdio:
    """The launcher's stdout and stderr, passed to a rank as it starts (a fork server's are as old as the server:
    output would miss a redirection made since). Unpickled in the rank as a pair of objects whose ``detach()``
    gives the rank's copy of each descriptor."""

    def __reduce__(self):
        from multiprocessing.reduction import DupFd  # only while a process is being started
        return tuple, ((DupFd(1), DupFd(2)),)


# A rank that has died without reporting may still have its result in flight; wait this long for it.
_DEAD_GRACE_S = 2.0


class LaunchError(RuntimeError):
    """A rank raised, died, or hung; the message holds each failed rank's traceback or exit code. ``crashed``:
    the ranks a crash signal ended (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL), a fault inside native code."""

    def __init__(self, message: str, crashed: Sequence[int] = ()):
        super().__init__(message)
        self.crashed = tuple(crashed)


CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL)


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    num_threads: int
    timeout_s: float
    group: Any = None  # process group to use; None = the default (WORLD)

    def synchronize(self) -> None:
        """Wait for queued device work, so host clocks bracket the real work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def find_free_port() -> int:
    """A currently free TCP port on localhost (may be taken by the time it is used; prefer TCPStore(0))."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks_on_node: int, requested: int = 0) -> int:
    """``requested`` if positive, else the cores of this machine shared evenly by its ranks."""
    return requested if requested > 0 else max(1, available_cores() // max(1, ranks_on_node))


FAULT_DELAY_S = 1.0  # kill / linkdown strike this long after the point starts: mid-run, not before it


def inject_fault(fault: str, rank: int) -> None:
    """Test hook (``"<kind>@<rank>"``): make ``rank`` raise, exit without reporting, crash (``segv``) or hang now;
    or, from a timer while it trains, SIGKILL itself (``kill``) or take its emulated host's link down
    (``linkdown``: ``ip link set <its Gloo interface> down``, inside the emulated network's namespace)."""
    if not fault:
        return
    kind, _, target = fault.partition("@")
    if int(target) != rank:
        return
    if kind in ("kill", "linkdown"):
        threading.Timer(FAULT_DELAY_S, _strike, (kind,)).start()
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "exit":
        os._exit(3)
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        while True:
            time.sleep(3600)


def _strike(kind: str) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    subprocess.run([shutil.which("ip") or "/usr/sbin/ip", "link", "set", interface, "down"], check=False,
                   capture_output=True, timeout=30)


def _make_context(rank, world_size, local_rank, local_world_size, backend, timeout_s, threads, group=None):
    num_threads = threads_per_rank(local_world_size, threads)
    torch.set_num_threads(num_threads)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return RankContext(rank, world_size, local_rank, backend, device, num_threads, timeout_s, group)


def enter_netns(path: str) -> None:
    """Move this thread (and the threads and processes it starts later) into the network namespace at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python >= 3.12
            os.setns(fd, os.CLONE_NEWNET)
        elif ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _pool_worker(rank, world_size, backend, store_addr, timeout_s, threads, tasks, results, place, environment,
                 stdio) -> None:
    """One rank of a :class:`RankPool`: set up once, then run each task that arrives until told to stop."""
    for fd, inherited in zip((1, 2), stdio):
        copy = inherited.detach()
        os.dup2(copy, fd)
        os.close(copy)
    faulthandler.enable()  # a rank killed by a signal (a crash inside torch) prints its Python stack to stderr
    task = _ABANDON
    try:
        os.environ.clear()  # the launching process's, as a spawned rank has it (not the fork server's, older)
        os.environ.update(environment, LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
        netns, interface = place
        if netns:  # an emulated host (harness.netem): its own network namespace, before any socket opens
            enter_netns(netns)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
        ctx = _make_context(rank, world_size, rank, world_size, backend, timeout_s, threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(store_addr[0], store_addr[1], world_size, is_master=False, timeout=timeout)
        init_default_group(backend, timeout, store=store, rank=rank, world_size=world_size)
        while isinstance(task := tasks.get(), tuple):
            task_id, fn, args = task
            try:
                results.put((rank, task_id, "ok", fn(ctx, *args)))
            except BaseException:  # noqa: BLE001 - everything goes back to the parent, which ends the pool
                results.put((rank, task_id, "error", traceback.format_exc()))
            gc.collect()  # the task's model and DDP (reference cycles) go before the next task is timed
            trim_heap()
    except BaseException:  # noqa: BLE001 - set-up failed: every task of this pool fails with it
        results.put((rank, None, "error", traceback.format_exc()))
    finally:
        end_rank(failed=task is not _STOP)


def init_default_group(backend: str, timeout: datetime.timedelta, **how) -> None:
    """``dist.init_process_group`` (``how``: its rendezvous), with ``torch.distributed.nn.functional`` imported first.
    That module's collectives take ``group=group.WORLD`` as a default argument, evaluated when it is first imported,
    and torch imports it with ``torch._dynamo`` (creating an optimizer does). Imported while a group exists, it
    holds that group for good: ``destroy_process_group()`` cannot free it and its Gloo threads live on into the
    interpreter's exit (:func:`end_rank`). Imported before any group, the defaults are None."""
    import torch.distributed.nn.functional  # noqa: F401

    dist.init_process_group(backend, timeout=timeout, **how)


_STOP, _ABANDON = None, "abandon"  # what a pool's ranks are told as it closes: all is well, or a rank failed


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
        print(f"[harness] rank {rank}: the final barrier failed ({str(exc).splitlines()[0][:200]}); destroying "
              f"the groups without it", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    gc.collect()
    left = gloo_threads()
    if left:
        print(f"[harness] rank {rank}: Gloo threads {left} still run after destroy_process_group(): something still "
              f"holds a process group, and the process may abort at exit", file=sys.stderr, flush=True)
    return left


def check_malloc_env(malloc: str) -> None:
    """Ranks started by torchrun/SLURM read their allocator's settings from the environment they were started
    with, which this process cannot change: refuse ``MALLOC_ENV[malloc]`` there unless it is already exported."""
    missing = {k: v for k, v in MALLOC_ENV[malloc].items() if os.environ.get(k) != v}
    if missing and env.in_place():
        raise ValueError(f"malloc={malloc!r} under torchrun/SLURM: export "
                         + " ".join(f"{k}={v}" for k, v in missing.items()) + " before launching")


@contextlib.contextmanager
def environ(extra: dict[str, str]):
    """``os.environ`` with ``extra`` set for the block (spawned children inherit it), restored after."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def trim_heap() -> None:
    """Hand the heap's free memory back to the system (glibc keeps it otherwise); pool ranks do it between
    tasks, so an idle rank holds only what it still uses."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _terminate(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


class RankPool:
    """``world_size`` spawned ranks kept alive across launches, so a sweep's points pay process start, imports
    and process-group set-up once instead of once each (most of a short point's time on a small machine).

    Each :meth:`run` sends ``fn`` and its arguments to every rank and waits as :func:`launch` does. Any failure
    (a rank raises, dies, hangs past the deadline) ends the pool, since peers may be stuck in a collective;
    the next :meth:`run` starts fresh ranks. Use as a context manager, or :meth:`close` it.

    Emulated hosts (:mod:`harness.netem`): ``places`` gives each rank a network namespace to enter and the
    interface Gloo binds to there; the ranks then reach the rendezvous store at ``store_host``. ``env``: set in
    the ranks' environment (e.g. ``MALLOC_ENV["retain"]``).
    """

    def __init__(self, world_size: int, backend: str = "gloo", *, timeout_s: float = 300.0, threads: int = 0,
                 places: Sequence[tuple[str, str]] = (), store_host: str = "127.0.0.1", env: dict | None = None):
        self.world_size, self.backend, self.timeout_s, self.threads = world_size, backend, timeout_s, threads
        self.env = dict(env or {})
        self.places, self.store_host = list(places) or [("", "")] * world_size, store_host
        self._procs: list = []
        self._tasks = 0

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        mp = start_method(self.env)
        self._results, self._queues = mp.Queue(), [mp.Queue() for _ in range(self.world_size)]
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size + 1, is_master=True, timeout=timeout,
                                    wait_for_workers=False)
        self._procs = [mp.Process(target=_pool_worker, daemon=True, name=f"rank{r}",
                                  args=(r, self.world_size, self.backend, (self.store_host, self._store.port),
                                        self.timeout_s, self.threads, self._queues[r], self._results,
                                        self.places[r], {**os.environ, **self.env}, _LauncherStdio()))
                       for r in range(self.world_size)]
        with environ(self.env):
            for p in self._procs:
                p.start()

    def close(self, orderly: bool = True) -> None:
        """Stop the ranks (politely when they are idle, by force after 5 s): each ends by :func:`end_rank`, as a
        failed rank unless the pool ends in order (``orderly=False`` after a failure: a peer may be dead or stuck)."""
        if not self._procs:
            return
        for q in self._queues:
            q.put(_STOP if orderly else _ABANDON)
        deadline = time.monotonic() + 5
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        _terminate(self._procs)
        self._procs = []
        del self._store

    def run(self, fn: Callable[..., Any], args: Sequence = (), deadline_s: float | None = None) -> list:
        """``fn(ctx, *args)`` on every rank; the results by rank, or :class:`LaunchError` (and the pool ends)."""
        if not self._procs:
            self._start()
        self._tasks += 1
        task_id = self._tasks
        for q in self._queues:
            q.put((task_id, fn, tuple(args)))
        try:
            outputs, errors = self._collect(task_id, deadline_s)
        except BaseException:
            self.close(orderly=False)
            raise
        if errors:
            procs = self._procs
            self.close(orderly=False)  # after which a rank a peer reported first has been reaped too
            crashed = [r for r, p in enumerate(procs) if -(p.exitcode or 0) in CRASH_SIGNALS]
            detail = "\n".join(f"--- rank {r} ---\n{msg.rstrip()}" for r, msg in sorted(errors.items()))
            detail += "".join(f"\nrank {r} crashed ({signal.Signals(-procs[r].exitcode).name})" for r in crashed)
            raise LaunchError(f"{len(errors)} of {self.world_size} rank(s) failed ({self.backend}):\n{detail}",
                              crashed)
        return [outputs[r] for r in range(self.world_size)]

    def _collect(self, task_id: int, deadline_s: float | None) -> tuple[dict, dict]:
        world_size, timeout_s = self.world_size, self.timeout_s
        start = time.monotonic()
        outputs: dict[int, Any] = {}
        errors: dict[int, str] = {}
        dead_since: dict[int, float] = {}
        first_done = None
        while len(outputs) < world_size and not errors:
            try:
                rank, done_id, status, payload = self._results.get(timeout=0.2)
            except queue.Empty:
                now = time.monotonic()
                for r, p in enumerate(self._procs):
                    if r not in outputs and p.exitcode is not None:
                        if now - dead_since.setdefault(r, now) > _DEAD_GRACE_S:
                            errors[r] = f"rank {r} exited with code {p.exitcode} without reporting a result"
                if deadline_s is not None and now - start > deadline_s:
                    errors.update({r: f"rank {r} still running after the {deadline_s:.0f} s deadline"
                                   for r in range(world_size) if r not in outputs})
                # Ranks that finished have completed every collective; one lagging by more than the
                # process-group timeout is stuck outside collectives.
                if first_done is not None and now - first_done > timeout_s:
                    errors.update({r: f"rank {r} still running {timeout_s:.0f} s after rank(s) "
                                      f"{sorted(outputs)} finished" for r in range(world_size) if r not in outputs})
                continue
            if done_id not in (task_id, None):
                continue  # cannot happen while every failure ends the pool; ignored rather than misfiled
            if status == "ok":
                outputs[rank] = payload
                first_done = first_done or time.monotonic()
            else:
                errors[rank] = payload
        return outputs, errors


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
    end_rank(failed=getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None)


def _run_in_place(fn, world_size, backend, args, timeout_s, threads) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"world_size={world_size} but the launcher started WORLD_SIZE={env_world} ranks")
    init_in_place(backend, timeout_s)
    group = None
    if dist.get_backend() != backend:  # e.g. a gloo point inside an nccl job
        group = dist.new_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    ctx = _make_context(rank, world_size, local_rank, local_world, backend, timeout_s, threads, group)
    try:
        status = ("ok", fn(ctx, *args))
    except Exception:  # noqa: BLE001 - peers must learn of it
        status = ("error", traceback.format_exc())
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, status, group=group)
    errors = {r: payload for r, (state, payload) in enumerate(gathered) if state != "ok"}
    if errors:
        detail = "\n".join(f"--- rank {r} ---\n{msg.rstrip()}" for r, msg in sorted(errors.items()))
        raise LaunchError(f"{len(errors)} of {world_size} rank(s) failed ({backend}):\n{detail}")
    return [payload for _, payload in gathered]


def refuse_in_bootstrapping_child() -> None:
    """Spawned ranks re-import the launching script; without a main guard it would launch (and store) again."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError("a spawned rank is re-running the launching script while it starts up: put the "
                           "driver's code under `if __name__ == '__main__':`")


def check_backend(backend: str, world_size: int) -> None:
    """Raise ValueError unless this machine can run ``world_size`` ranks on ``backend``: NCCL needs CUDA and
    one visible GPU per rank on this node."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend == "mpi" and not dist.is_mpi_available():
        raise ValueError("backend='mpi' needs a torch built with MPI, and torch.distributed.is_mpi_available() is "
                         "False in this torch build (pip's wheels have no MPI); use backend='gloo' (CPU) or 'nccl' "
                         "(GPUs), or a torch built from source with MPI")
    if backend == "mpi" and not env.in_place():
        raise ValueError("backend='mpi' needs ranks started by the MPI launcher (mpirun, or srun --mpi) with RANK, "
                         "WORLD_SIZE and LOCAL_RANK exported; the spawned launcher cannot start MPI ranks")
    if backend != "nccl":
        return
    if not env.cuda_available():
        raise ValueError("backend='nccl' needs CUDA, but torch.cuda.is_available() is False")
    local, gpus = env.ranks_on_this_node(world_size), env.cuda_devices()
    if local > gpus:
        raise ValueError(f"world_size={world_size} puts {local} ranks on this node but only {gpus} GPU(s) are "
                         f"visible; backend='nccl' needs one GPU per rank")


def launch(fn: Callable[..., Any], world_size: int, backend: str = "gloo", *, args: Sequence = (),
           timeout_s: float = 300.0, threads: int = 0, deadline_s: float | None = None,
           rank_env: dict | None = None) -> list:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks; return the results indexed by rank.

    ``fn`` must be a module-level function (it is pickled into spawned ranks). ``timeout_s`` is the
    process-group timeout; ``threads`` (0 = auto) the torch threads per rank; ``deadline_s`` an optional
    wall-clock limit for the whole launch (spawned mode); ``rank_env`` is set in the spawned ranks' environment.
    Raises :class:`LaunchError` if any rank fails.
    (Ranks behind an emulated network: ``harness.netem.NamespacePool``, which runs a :class:`RankPool` inside.)
    """
    refuse_in_bootstrapping_child()
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    check_backend(backend, world_size)
    if env.in_place():
        return _run_in_place(fn, world_size, backend, args, timeout_s, threads)
    sys.stdout.flush()
    with RankPool(world_size, backend, timeout_s=timeout_s, threads=threads, env=rank_env) as pool:
        return pool.run(fn, args, deadline_s)
