"""Spawned ranks kept alive for many launches (:class:`RankPool`): a sweep's points pay process start, imports and
process-group set-up once per pool, and :func:`harness.launch.spawn.launch` is a pool used once.

The parent hosts the rendezvous TCPStore on a kernel-chosen free port (no port race) and listens on one queue
for every rank's result or traceback; a rank that reports an error, dies without reporting or hangs fails the
task at once and ends the pool, so a crashed rank never hangs the parent.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import multiprocessing
import os
import queue
import signal
import time
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from harness.launch import env
from harness.launch.allocator import trim_heap
from harness.launch.context import make_context
from harness.launch.failures import CRASH_SIGNALS, launch_error
from harness.launch.groups import end_rank, init_default_group

# What the fork server imports once for every rank it starts (each rank would otherwise pay torch's import, seconds
# of a small machine's CPU). Nothing here may touch CUDA: a forked process cannot use a CUDA its parent set up.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch.distributed.nn.functional", "harness.workloads.runner"]


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

_STOP, _ABANDON = None, "abandon"  # what a pool's ranks are told as it closes: all is well, or a rank failed


def _pool_worker(
    rank, world_size, backend, store_addr, timeout_s, threads, tasks, results, setup, environment, stdio
) -> None:
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
        if setup is not None:  # before any socket opens (an emulated host's harness.netem.netns.Host.enter)
            setup()
        ctx = make_context(rank, world_size, rank, world_size, backend, timeout_s, threads)
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

    Each :meth:`run` sends ``fn`` and its arguments to every rank and waits as
    :func:`harness.launch.spawn.launch` does. Any failure (a rank raises, dies, hangs past the deadline) ends the
    pool, since peers may be stuck in a collective; the next :meth:`run` starts fresh ranks. Use as a context
    manager, or :meth:`close` it.

    ``rank_setup``: per rank, a function it runs first, before any socket opens (an emulated host's
    :meth:`harness.netem.netns.Host.enter`); the ranks reach the rendezvous store at ``store_host``. ``env``: set in the
    ranks' environment (e.g. ``harness.launch.allocator.MALLOC_ENV["retain"]``).
    """

    def __init__(
        self,
        world_size: int,
        backend: str = "gloo",
        *,
        timeout_s: float = 300.0,
        threads: int = 0,
        rank_setup: Sequence[Callable[[], None]] = (),
        store_host: str = "127.0.0.1",
        env: dict | None = None,
    ):
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
        self._store = dist.TCPStore(
            "127.0.0.1", 0, self.world_size + 1, is_master=True, timeout=timeout, wait_for_workers=False
        )
        self._procs = [
            mp.Process(
                target=_pool_worker,
                daemon=True,
                name=f"rank{r}",
                args=(
                    r,
                    self.world_size,
                    self.backend,
                    (self.store_host, self._store.port),
                    self.timeout_s,
                    self.threads,
                    self._queues[r],
                    self._results,
                    self.rank_setup[r],
                    {**os.environ, **self.env},
                    _LauncherStdio(),
                ),
            )
            for r in range(self.world_size)
        ]
        with env.environ(self.env):
            for p in self._procs:
                p.start()

    def close(self, orderly: bool = True) -> None:
        """Stop the ranks (politely when they are idle, by force after 5 s): each ends by
        :func:`harness.launch.groups.end_rank`, as a failed rank unless the pool ends in order (``orderly=False``
        after a failure: a peer may be dead or stuck)."""
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
        """``fn(ctx, *args)`` on every rank; the results by rank, or
        :class:`~harness.launch.failures.LaunchError` (and the pool ends)."""
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
            crashed = {
                r: signal.Signals(-p.exitcode).name for r, p in enumerate(procs) if -(p.exitcode or 0) in CRASH_SIGNALS
            }
            raise launch_error(errors, self.world_size, self.backend, died, crashed, stuck)
        return [outputs[r] for r in range(self.world_size)]

    def _collect(self, task_id: int, deadline_s: float | None) -> tuple[dict, dict, dict, list]:
        """(results, errors in the order reported, exit codes of the ranks that died without reporting, in the
        order seen, the ranks found still running at a deadline). After the first failure it listens
        :data:`_CAUSE_GRACE_S` longer, so that the cause is in."""
        world_size, start = self.world_size, time.monotonic()
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
                failed = failed_at is not None
                died.update(self._dead_without_report(outputs.keys() | errors.keys() | died.keys(), dead_since, failed))
                if not failed:
                    reported = outputs.keys() | errors.keys() | died.keys()
                    stuck += self._past_deadline(reported, errors, start, deadline_s, first_done, outputs)
                continue
            if done_id not in (task_id, None):
                continue  # cannot happen while every failure ends the pool; ignored rather than misfiled
            if status == "ok":
                outputs[rank] = payload
                first_done = first_done or time.monotonic()
            else:
                errors[rank] = payload
        return outputs, errors, died, stuck

    def _dead_without_report(self, reported, dead_since: dict[int, float], failed: bool) -> dict[int, int]:
        """Exit codes of the ranks that died without reporting: at once after a failure, else once their result
        cannot be in flight any more."""
        now, died = time.monotonic(), {}
        for r, p in enumerate(self._procs):
            if r not in reported and p.exitcode is not None:
                if failed or now - dead_since.setdefault(r, now) > _DEAD_GRACE_S:
                    died[r] = p.exitcode
        return died

    def _past_deadline(self, reported, errors: dict, start: float, deadline_s, first_done, outputs) -> list[int]:
        """The ranks still running past the deadline, or lagging finished ranks by more than the process-group
        timeout (ranks that finished have completed every collective: a laggard is stuck outside them); their
        errors are added to ``errors``."""
        now = time.monotonic()
        running = [r for r in range(self.world_size) if r not in reported]
        if deadline_s is not None and now - start > deadline_s:
            errors.update({r: f"rank {r} still running after the {deadline_s:.0f} s deadline" for r in running})
            return running
        if first_done is not None and now - first_done > self.timeout_s:
            after = f"{self.timeout_s:.0f} s after rank(s) {sorted(outputs)} finished"
            errors.update({r: f"rank {r} still running {after}" for r in running})
            return running
        return []
