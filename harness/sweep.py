"""Resumable sweeps: run each point not yet stored, store it atomically, keep going on failures.

    from harness import TrainConfig, run_sweep
    points = [TrainConfig(model="resnet50", impl="ours", bucket_cap_mb=mb) for mb in (0, 5, 25, 100)]
    df = run_sweep("fig7", points)          # rerun after a kill: stored points are skipped
    run_sweep("fig7", points, dry_run=True)  # list the points and whether each is stored

Repetitions of a point (``repeat=0, 1, ...``) are separate stored points; the sweep runs one pass per
repetition, each pass in a seeded shuffle (:func:`schedule`), so drift of the machine's speed spreads over all
points instead of reading as an effect between neighbours.

All points are validated before the first launch, so a bad value fails the sweep before anything runs (with a
:class:`~harness.launch.errors.ConfigError`: command lines print it as one ``error:`` line). A
point that raises, crashes or times out is stored as one row with ``error`` set; rerun with
``retry_errors=True`` to try those again. Under torchrun (RANK set) the same call runs each point in place:
rank 0 decides which points are pending and writes the results; points whose world_size differs from the
job's WORLD_SIZE are skipped with a note, so one driver can serve jobs of several sizes.

The run order and the groups of points measured together are :mod:`harness.sweep_order`'s; what is stored and
pending, :mod:`harness.sweep_store`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import sys
import time
import traceback
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from harness import results
from harness.config import (
    AllreduceConfig,
    ConvergenceConfig,
    PointConfig,
    TrainConfig,
    auto_net_is_loopback,
    config_columns,
    point_id,
    validate,
)
from harness.launch.allocator import MALLOC_ENV
from harness.launch.env import in_place
from harness.launch.errors import refusing
from harness.launch.spawn import LaunchError, RankPool, launch, refuse_in_bootstrapping_child
from harness.netem import autorate
from harness.netem import shaping as netem
from harness.preflight import memory_bytes, preflight
from harness.sweep_in_place import agree_in_place, this_jobs_points
from harness.sweep_order import describe, interleaved_groups, schedule
from harness.sweep_store import PointStore, pending_ids, print_plan
from harness.workloads.collectives import run_allreduce_point
from harness.workloads.convergence import run_convergence_point
from harness.workloads.runner import run_training_point, run_training_points

MAX_ERROR_CHARS = 8000


def run_point(cfg: PointConfig, deadline_s: float | None = None, fn=None, fn_args: tuple = ()) -> list[dict]:
    """Validate one point, check the machine for it, launch its ranks and return their rows (all ranks).
    ``fn(ctx, cfg, *fn_args)`` (a module-level function returning a list of row dicts; ``fn_args`` travel as JSON)
    replaces the point type's own rank function: a probe then runs on exactly the ranks, threads and network the
    point would measure on."""
    with refusing():
        cfg = validate(cfg)
        preflight([cfg])
    with contextlib.ExitStack() as pools:
        return _measure([cfg], deadline_s, _Pools(pools), fn, fn_args)[0]


def available_memory_fraction() -> float:
    """The share of this machine's memory the kernel says is available (1.0 where it does not say)."""
    available, total = memory_bytes()
    return available / total if total < math.inf else 1.0


class _Pools(dict):
    """The ranks a sweep keeps between its points, one pool per (network, ranks, backend, timeout, threads, hosts,
    allocator): process start, imports and process-group set-up are paid once per pool, not once per point. Closed
    with the ``ExitStack`` given; a pool whose point failed starts fresh ranks for the next one. Idle pools hold their
    ranks' memory (big models, optimizer state), so before a new pool starts while less than ``MIN_AVAILABLE``
    of the memory is available, the others are closed. A point measuring memory gets fresh ranks (``fresh``): on
    CPU its peak is the resident set's rise over the process's size before it, and memory earlier points freed
    but the allocator kept would be reused without showing (profiled peaks read 13-36% above the measured ones)."""

    MIN_AVAILABLE = 0.5

    def __init__(self, stack: contextlib.ExitStack):
        super().__init__()
        self.stack = stack

    def get_for(self, cfg: PointConfig, rate_mbit: float | None, fresh: bool = False):
        key = self._key(cfg, rate_mbit)
        if fresh and key in self:
            self.pop(key).close()
        if key not in self:
            self[key] = self._new(cfg, rate_mbit, emulated=rate_mbit is not None)
        return self[key]

    def point_rate(self, cfg: PointConfig) -> tuple[float | None, float]:
        """:func:`harness.netem.autorate.point_rate`, ``net=auto``'s backward timed on the ranks that will run behind
        the rate: a pool started with its link unshaped, then shaped at the rate found and kept for the points."""
        unshaped = []

        def run(fn, args):
            unshaped.append(self._new(cfg, None, emulated=True))
            return unshaped[0].run(fn, args)

        rate_mbit, backward_ms = autorate.point_rate(cfg, run)
        if unshaped:
            unshaped[0].shape(rate_mbit)
            self[self._key(cfg, rate_mbit)] = unshaped[0]
        return rate_mbit, backward_ms

    @staticmethod
    def _key(cfg: PointConfig, rate_mbit: float | None) -> tuple:
        return (
            rate_mbit,
            cfg.world_size,
            cfg.backend,
            cfg.timeout_s,
            cfg.threads_per_rank,
            getattr(cfg, "hosts", 1),
            getattr(cfg, "malloc", "default"),
        )

    def _new(self, cfg: PointConfig, rate_mbit: float | None, emulated: bool):
        if self and available_memory_fraction() < self.MIN_AVAILABLE:
            for other in list(self):
                self.pop(other).close()
        malloc = getattr(cfg, "malloc", "default")
        how = dict(timeout_s=cfg.timeout_s, threads=cfg.threads_per_rank, env=rank_env(malloc, emulated))
        pool = (
            netem.NamespacePool(cfg.world_size, cfg.backend, rate_mbit=rate_mbit, hosts=getattr(cfg, "hosts", 1), **how)
            if emulated
            else RankPool(cfg.world_size, cfg.backend, **how)
        )
        return self.stack.enter_context(pool)


def rank_env(malloc: str, emulated: bool) -> dict[str, str]:
    """What a pool sets in its ranks' environment: the allocator's settings and, behind an emulated link, c10d's
    C++ log kept to errors (unless the user set a level). Those ranks run in a network namespace without DNS, where
    every rank's store client warns that "the hostname of the client socket cannot be retrieved" when it names its
    own loopback address (``::ffff:127.0.0.1``, which /etc/hosts does not list): noise on every run, nothing wrong."""
    quiet = {} if not emulated or "TORCH_CPP_LOG_LEVEL" in os.environ else {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    return {**MALLOC_ENV[malloc], **quiet}


def _measure(
    cfgs: list[PointConfig], deadline_s: float | None, pools: _Pools, fn=None, fn_args: tuple = ()
) -> list[list[dict]]:
    """Run validated points on their pool's ranks (behind an emulated link where their ``net`` asks) and return
    each point's rows (all ranks) with the config columns and the network that was used: one point by its type's
    rank function (or ``fn``), several in one task by :func:`harness.workloads.runner.run_training_points`."""
    if fn is None and len(cfgs) == 1:
        fn = {
            TrainConfig: run_training_point,
            ConvergenceConfig: run_convergence_point,
            AllreduceConfig: run_allreduce_point,
        }[type(cfgs[0])]
    cfg = cfgs[0]
    # None = plain loopback; auto is measured (cached), on the pool's ranks unless torchrun started them
    rate_mbit, auto_backward_ms = autorate.point_rate(cfg) if in_place() else pools.point_rate(cfg)
    task, args = (fn, (cfg, *fn_args)) if fn else (run_training_points, (cfgs,))
    deadline_s = deadline_s and deadline_s * len(cfgs)
    if in_place():
        per_rank = launch(
            task, cfg.world_size, cfg.backend, args=args, timeout_s=cfg.timeout_s, threads=cfg.threads_per_rank
        )
    else:
        per_rank = _run_on_pool(pools, cfg, rate_mbit, task, args, deadline_s)
    per_rank = per_rank if not fn else [[rows] for rows in per_rank]  # rank -> point -> rows
    network = {"net_rate_mbit": math.nan if rate_mbit is None else rate_mbit, "net_auto_backward_ms": auto_backward_ms}
    out = []
    for k, c in enumerate(cfgs):
        columns = {
            **config_columns(c),
            **network,
            "net_auto_loopback": auto_net_is_loopback(
                type(c).__name__, c.backend, c.world_size, getattr(c, "impl", "")
            ),
        }
        out.append([{**columns, **row} for rank in per_rank for row in rank[k]])
    return out


def _run_on_pool(pools: _Pools, cfg: PointConfig, rate_mbit: float | None, task, args, deadline_s):
    """``task`` on the pool for ``cfg``. A point measuring memory runs an iteration under torch's memory profiler,
    which can crash a rank (SIGSEGV inside the profiled iteration, rarely and not reproducibly): a point whose rank
    crashed is measured once more on fresh ranks, and says so."""
    memory = getattr(cfg, "memory", False)
    try:
        return pools.get_for(cfg, rate_mbit, fresh=memory).run(task, args, deadline_s)
    except LaunchError as exc:
        if not (memory and exc.crashed):
            raise
        print(
            f"[sweep] rank(s) {list(exc.crashed)} crashed measuring memory; measuring the point again on fresh ranks",
            file=sys.stderr,
            flush=True,
        )
        return pools.get_for(cfg, rate_mbit, fresh=True).run(task, args, deadline_s)


def _error_row(cfg: PointConfig, exc: BaseException) -> dict:
    """The point's error row: the root cause as fields (a launch's first failed rank and how it failed; else the
    exception's own line) and first in the text, whose middle is cut when long."""
    if isinstance(exc, LaunchError):  # its cause, or its first line where nothing more is known (a helper died)
        failed_rank, cause, text = exc.failed_rank, exc.cause or str(exc).splitlines()[0], str(exc)
    else:
        failed_rank, cause = None, "".join(traceback.format_exception_only(exc)).strip()
        text = f"{cause}\n" + "".join(traceback.format_exception(exc)).strip()
    if len(text) > MAX_ERROR_CHARS:
        head = text.splitlines()[0][: MAX_ERROR_CHARS // 4]
        text = f"{head}\n...\n" + text[-(MAX_ERROR_CHARS - len(head)) :]
    return {**config_columns(cfg), "error": text, "failed_rank": failed_rank, "cause": cause}


def run_sweep(
    experiment: str,
    points: Sequence[PointConfig],
    *,
    root: str | os.PathLike | None = None,
    dry_run: bool = False,
    retry_errors: bool = False,
    progress: bool = True,
    deadline_s: float | None = None,
    order_seed: int = 0,
) -> pd.DataFrame:
    """Run every point of ``experiment`` not yet stored, in :func:`schedule`'s order; return all stored rows.

    ``dry_run`` returns (and prints) one row per point: point_id, stored or pending, and its config.
    ``deadline_s`` bounds each spawned point's wall-clock time. ``root`` overrides the results folder.
    ``order_seed`` seeds the shuffle of each pass (stored with the rows, as is each point's ``run_position``).
    """
    refuse_in_bootstrapping_child()
    with refusing():  # every bad value raises here, before any launch
        resolved = [validate(p) for p in points]
    unique = this_jobs_points(experiment, schedule({point_id(p): p for p in resolved}, order_seed))  # once each
    pending = pending_ids(experiment, list(unique), root, retry_errors)
    if dry_run:
        return print_plan(unique, pending)
    with refusing():
        preflight(unique[pid] for pid in pending)  # the machine, once: GPUs, namespaces, data on disk
    pending, available, writer = agree_in_place(unique, pending, memory_bytes()[0])
    todo = {pid: cfg for pid, cfg in unique.items() if pid in pending}
    tasks = interleaved_groups(todo, available)
    shown = progress and writer
    bar = tqdm(total=len(unique), desc=experiment, unit="point", disable=not shown, file=sys.stderr, dynamic_ncols=True)
    with bar, contextlib.ExitStack() as stack:
        pools = _Pools(stack)
        bar.update(len(unique) - len(pending))
        store = PointStore(experiment, root, tasks, list(unique), writer, on_stored=lambda: bar.update(1))
        meta = {"git_commit": results.git_commit() if writer else ""}
        for task in tasks:
            cfgs = [todo[pid] for pid in task]
            bar.set_postfix_str(describe(cfgs), refresh=True)
            measured, timing = _measure_task(experiment, task, cfgs, deadline_s, pools, writer)
            store.add(task, measured, {**meta, **timing, "order_seed": order_seed, "group": "+".join(task)})
    return results.load_results(experiment, root)


def _measure_task(
    experiment: str, task: list[str], cfgs: list[PointConfig], deadline_s, pools: _Pools, writer: bool
) -> tuple[list[list[dict]], dict]:
    """One task's rows per point (an error row each if it failed: the sweep goes on), and when it started and its
    seconds per point."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    try:
        measured = _measure(cfgs, deadline_s, pools)
    except Exception as exc:  # noqa: BLE001 - the sweep goes on; the error is stored
        measured = [[_error_row(cfg, exc)] for cfg in cfgs]
        if writer:
            tqdm.write(f"[{experiment}] {', '.join(task)} failed: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    return measured, {"started_at": started, "point_seconds": (time.monotonic() - t0) / len(cfgs)}
