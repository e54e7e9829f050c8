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
  namespace (the sweep picks it for points with a ``net``); this module knows nothing of it, and runs only the
  set-up function it is given in each rank (``rank_setup``).

Every process group gets ``timeout_s``, so a collective waiting on a hung or dead peer raises instead of
blocking forever. Every rank, spawned or in place, ends by :func:`harness.groups.end_rank` (spawned ranks when
their pool closes, torchrun/SLURM ranks at exit).
Threads: each rank uses ``max(1, cores // ranks_on_this_node)`` unless told otherwise, and records it in
``ctx.num_threads``. NCCL ranks use GPU ``local_rank``.
"""
from __future__ import annotations

import datetime
import faulthandler
import gc
import multiprocessing
import os
import queue
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from harness import env
from harness.allocator import trim_heap
from harness.backends import check_backend
from harness.groups import end_rank, init_default_group, init_in_place

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
# Once one rank has failed, how long the parent keeps listening before it ends the ranks: a peer's death shows
# in its exit code a moment after the survivors have seen their connections reset, and it, not their error, is
# the cause.
_CAUSE_GRACE_S = 1.0


class LaunchError(RuntimeError):
    """A rank raised, died, or hung. ``failed_rank`` failed first and ``cause`` says how (its signal, exit code,
    or its exception's last line); the message starts with them, then holds each failed rank's traceback or why
    it failed. ``crashed``: the ranks a crash signal ended (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL), a fault
    inside native code."""

    def __init__(self, message: str, crashed: Sequence[int] = (), failed_rank: int | None = None,
                 cause: str = ""):
        super().__init__(message)
        self.crashed = tuple(crashed)
        self.failed_rank, self.cause = failed_rank, cause


CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL)


def exit_cause(exitcode: int) -> str:
    """How a process ended, in words: its signal's name, or its exit code."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def root_cause(errors: dict[int, str], died: dict[int, int], stuck: Sequence[int] = ()) -> tuple[int | None, str]:
    """(the rank that failed first, how): a rank that died is the cause, before what its peers saw of it (a
    connection reset, a timeout); otherwise the first rank to report (``errors`` in the order reported); otherwise
    no rank, when the ranks were only ``stuck`` (still running at a deadline: the parent's observation)."""
    if died:
        rank = next(iter(died))
        return rank, exit_cause(died[rank])
    reported = [r for r in errors if r not in stuck]
    if reported:
        return reported[0], _last_line(errors[reported[0]])
    why = _last_line(errors[stuck[0]]).removeprefix(f"rank {stuck[0]} still running")
    return None, f"rank(s) {sorted(stuck)} still running{why}"


def _launch_error(errors: dict[int, str], world_size: int, backend: str, died: dict[int, int] | None = None,
                  crashed: dict | None = None, stuck: Sequence[int] = ()) -> LaunchError:
    """One error for the whole launch: the root cause first, then each failed rank's traceback or why it failed,
    then the ranks a crash signal ended (rank -> the signal's name)."""
    died, crashed = died or {}, crashed or {}
    failed_rank, cause = root_cause(errors, died, stuck)
    errors = {**{r: f"rank {r} {exit_cause(code)} without reporting a result" for r, code in died.items()},
              **errors}
    detail = "\n".join(f"--- rank {r} ---\n{msg.rstrip()}" for r, msg in sorted(errors.items()))
    detail += "".join(f"\nrank {r} crashed ({name})" for r, name in crashed.items())
    first = "no rank failed" if failed_rank is None else f"rank {failed_rank} failed first"
    return LaunchError(f"{first}: {cause}\n{len(errors)} of {world_size} rank(s) failed "
                       f"({backend}):\n{detail}", list(crashed), failed_rank, cause)


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


def _make_context(rank, world_size, local_rank, local_world_size, backend, timeout_s, threads, group=None):
    num_threads = env.threads_per_rank(local_world_size, threads)
    torch.set_num_threads(num_threads)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return RankContext(rank, world_size, local_rank, backend, device, num_threads, timeout_s, group)


def _pool_worker(rank, world_size, backend, store_addr, timeout_s, threads, tasks, results, setup, environment,
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
        if setup is not None:  # before any socket opens (an emulated host's harness.netns.Host.enter)
            setup()
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


_STOP, _ABANDON = None, "abandon"  # what a pool's ranks are told as it closes: all is well, or a rank failed


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

    ``rank_setup``: per rank, a function it runs first, before any socket opens (an emulated host's
    :meth:`harness.netns.Host.enter`); the ranks reach the rendezvous store at ``store_host``. ``env``: set in the
    ranks' environment (e.g. ``harness.allocator.MALLOC_ENV["retain"]``).
    """

    def __init__(self, world_size: int, backend: str = "gloo", *, timeout_s: float = 300.0, threads: int = 0,
                 rank_setup: Sequence[Callable[[], None]] = (), store_host: str = "127.0.0.1",
                 env: dict | None = None):
        self.world_size, self.backend, self.timeout_s, self.threads = world_size, backend, timeout_s, threads
        self.env = dict(env or {})
        self.rank_setup, self.store_host = list(rank_setup) or [None] * world_size, store_host
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
                                        self.rank_setup[r], {**os.environ, **self.env}, _LauncherStdio()))
                       for r in range(self.world_size)]
        with env.environ(self.env):
            for p in self._procs:
                p.start()

    def close(self, orderly: bool = True) -> None:
        """Stop the ranks (politely when they are idle, by force after 5 s): each ends by
        :func:`harness.groups.end_rank`, as a failed rank unless the pool ends in order (``orderly=False`` after a
        failure: a peer may be dead or stuck)."""
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
            outputs, errors, died, stuck = self._collect(task_id, deadline_s)
        except BaseException:
            self.close(orderly=False)
            raise
        if errors or died:
            procs = self._procs
            self.close(orderly=False)  # after which a rank a peer reported first has been reaped too
            crashed = {r: signal.Signals(-p.exitcode).name for r, p in enumerate(procs)
                       if -(p.exitcode or 0) in CRASH_SIGNALS}
            raise _launch_error(errors, self.world_size, self.backend, died, crashed, stuck)
        return [outputs[r] for r in range(self.world_size)]

    def _collect(self, task_id: int, deadline_s: float | None) -> tuple[dict, dict, dict, list]:
        """(results, errors in the order reported, exit codes of the ranks that died without reporting, in the
        order seen, the ranks found still running at a deadline). After the first failure it listens
        :data:`_CAUSE_GRACE_S` longer, so that the cause is in."""
        world_size, timeout_s = self.world_size, self.timeout_s
        start = time.monotonic()
        outputs: dict[int, Any] = {}
        errors: dict[int, str] = {}
        died: dict[int, int] = {}
        stuck: list[int] = []
        dead_since: dict[int, float] = {}
        first_done = failed_at = None
        while len(outputs) + len(errors) + len(died) < world_size:
            now = time.monotonic()
            if failed_at is None and (errors or died):
                failed_at = now
            if failed_at is not None and now - failed_at > _CAUSE_GRACE_S:
                break
            try:
                rank, done_id, status, payload = self._results.get(timeout=0.2)
            except queue.Empty:
                now = time.monotonic()
                for r, p in enumerate(self._procs):
                    if r not in outputs and r not in errors and r not in died and p.exitcode is not None:
                        # dead without a report: at once after a failure, else once its result cannot be in flight
                        if failed_at is not None or now - dead_since.setdefault(r, now) > _DEAD_GRACE_S:
                            died[r] = p.exitcode
                if failed_at is not None:
                    continue
                running = [r for r in range(world_size) if r not in outputs and r not in errors and r not in died]
                if deadline_s is not None and now - start > deadline_s:
                    stuck += running
                    errors.update({r: f"rank {r} still running after the {deadline_s:.0f} s deadline"
                                   for r in running})
                # Ranks that finished have completed every collective; one lagging by more than the
                # process-group timeout is stuck outside collectives.
                elif first_done is not None and now - first_done > timeout_s:
                    stuck += running
                    errors.update({r: f"rank {r} still running {timeout_s:.0f} s after rank(s) "
                                      f"{sorted(outputs)} finished" for r in running})
                continue
            if done_id not in (task_id, None):
                continue  # cannot happen while every failure ends the pool; ignored rather than misfiled
            if status == "ok":
                outputs[rank] = payload
                first_done = first_done or time.monotonic()
            else:
                errors[rank] = payload
        return outputs, errors, died, stuck


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
        status = ("ok", fn(ctx, *args), 0.0)
    except Exception:  # noqa: BLE001 - peers must learn of it
        status = ("error", traceback.format_exc(), time.time())  # when: the first to fail is the cause
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, status, group=group)
    failed = sorted((when, r) for r, (state, _, when) in enumerate(gathered) if state != "ok")
    if failed:
        raise _launch_error({r: gathered[r][1] for _, r in failed}, world_size, backend)
    return [payload for _, payload, _ in gathered]


def refuse_in_bootstrapping_child() -> None:
    """Spawned ranks re-import the launching script; without a main guard it would launch (and store) again."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError("a spawned rank is re-running the launching script while it starts up: put the "
                           "driver's code under `if __name__ == '__main__':`")


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
