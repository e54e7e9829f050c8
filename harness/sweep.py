"""Resumable sweeps: run each point not yet stored, store it atomically, keep going on failures.

    from harness import TrainConfig, run_sweep
    points = [TrainConfig(model="resnet50", impl="ours", bucket_cap_mb=mb) for mb in (0, 5, 25, 100)]
    df = run_sweep("fig7", points)          # rerun after a kill: stored points are skipped
    run_sweep("fig7", points, dry_run=True)  # list the points and whether each is stored

Repetitions of a point (``repeat=0, 1, ...``) are separate stored points; the sweep runs one pass per
repetition, each pass in a seeded shuffle (:func:`schedule`), so drift of the machine's speed spreads over all
points instead of reading as an effect between neighbours.

All points are validated before the first launch, so a bad value fails the sweep before anything runs (with a
:class:`~harness.errors.ConfigError`: command lines print it as one ``error:`` line). A
point that raises, crashes or times out is stored as one row with ``error`` set; rerun with
``retry_errors=True`` to try those again. Under torchrun (RANK set) the same call runs each point in place:
rank 0 decides which points are pending and writes the results; points whose world_size differs from the
job's WORLD_SIZE are skipped with a note, so one driver can serve jobs of several sizes.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import math
import os
import random
import sys
import time
import traceback
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from harness import autorate, netem, results
from harness.collectives import run_allreduce_point
from harness.config import (AllreduceConfig, ConvergenceConfig, PointConfig, TrainConfig, auto_net_is_loopback,
                            config_columns, point_id, validate)
from harness.convergence import run_convergence_point
from harness.env import in_place, is_writer
from harness.errors import refusing
from harness.allocator import MALLOC_ENV
from harness.groups import init_in_place
from harness.launch import LaunchError, RankPool, launch, refuse_in_bootstrapping_child
from harness.preflight import memory_bytes, model_param_bytes, preflight
from harness.runner import run_training_point, run_training_points

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
        """:func:`harness.autorate.point_rate`, ``net=auto``'s backward timed on the ranks that will run behind
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
        return (rate_mbit, cfg.world_size, cfg.backend, cfg.timeout_s, cfg.threads_per_rank, getattr(cfg, "hosts", 1),
                getattr(cfg, "malloc", "default"))

    def _new(self, cfg: PointConfig, rate_mbit: float | None, emulated: bool):
        if self and available_memory_fraction() < self.MIN_AVAILABLE:
            for other in list(self):
                self.pop(other).close()
        malloc = getattr(cfg, "malloc", "default")
        how = dict(timeout_s=cfg.timeout_s, threads=cfg.threads_per_rank, env=rank_env(malloc, emulated))
        pool = (netem.NamespacePool(cfg.world_size, cfg.backend, rate_mbit=rate_mbit, hosts=getattr(cfg, "hosts", 1),
                                    **how) if emulated else RankPool(cfg.world_size, cfg.backend, **how))
        return self.stack.enter_context(pool)


def rank_env(malloc: str, emulated: bool) -> dict[str, str]:
    """What a pool sets in its ranks' environment: the allocator's settings and, behind an emulated link, c10d's
    C++ log kept to errors (unless the user set a level). Those ranks run in a network namespace without DNS, where
    every rank's store client warns that "the hostname of the client socket cannot be retrieved" when it names its
    own loopback address (``::ffff:127.0.0.1``, which /etc/hosts does not list): noise on every run, nothing wrong."""
    quiet = {} if not emulated or "TORCH_CPP_LOG_LEVEL" in os.environ else {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    return {**MALLOC_ENV[malloc], **quiet}


def _measure(cfgs: list[PointConfig], deadline_s: float | None, pools: _Pools, fn=None,
             fn_args: tuple = ()) -> list[list[dict]]:
    """Run validated points on their pool's ranks (behind an emulated link where their ``net`` asks) and return
    each point's rows (all ranks) with the config columns and the network that was used: one point by its type's
    rank function (or ``fn``), several in one task by :func:`harness.runner.run_training_points`."""
    if fn is None and len(cfgs) == 1:
        fn = {TrainConfig: run_training_point, ConvergenceConfig: run_convergence_point,
              AllreduceConfig: run_allreduce_point}[type(cfgs[0])]
    cfg = cfgs[0]
    # None = plain loopback; auto is measured (cached), on the pool's ranks unless torchrun started them
    rate_mbit, auto_backward_ms = autorate.point_rate(cfg) if in_place() else pools.point_rate(cfg)
    task, args = (fn, (cfg, *fn_args)) if fn else (run_training_points, (cfgs,))
    deadline_s = deadline_s and deadline_s * len(cfgs)
    if in_place():
        per_rank = launch(task, cfg.world_size, cfg.backend, args=args, timeout_s=cfg.timeout_s,
                          threads=cfg.threads_per_rank)
    else:
        per_rank = _run_on_pool(pools, cfg, rate_mbit, task, args, deadline_s)
    per_rank = per_rank if not fn else [[rows] for rows in per_rank]  # rank -> point -> rows
    network = {"net_rate_mbit": math.nan if rate_mbit is None else rate_mbit, "net_auto_backward_ms": auto_backward_ms}
    out = []
    for k, c in enumerate(cfgs):
        columns = {**config_columns(c), **network, "net_auto_loopback": auto_net_is_loopback(
            type(c).__name__, c.backend, c.world_size, getattr(c, "impl", ""))}
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
        print(f"[sweep] rank(s) {list(exc.crashed)} crashed measuring memory; measuring the point again on fresh "
              f"ranks", file=sys.stderr, flush=True)
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
        head = text.splitlines()[0][:MAX_ERROR_CHARS // 4]
        text = f"{head}\n...\n" + text[-(MAX_ERROR_CHARS - len(head)):]
    return {**config_columns(cfg), "error": text, "failed_rank": failed_rank, "cause": cause}


def _pending(experiment: str, ids: list[str], root, retry_errors: bool) -> set[str]:
    stored = results.stored_point_ids(experiment, root)
    if retry_errors:
        stored -= results.failed_point_ids(experiment, root)
    return {pid for pid in ids if pid not in stored}


def _agree(pending: set[str], available_bytes: float, backend: str, timeout_s: float) -> tuple[set[str], float]:
    """Under torchrun only rank 0's file system counts, and every rank must form the same tasks: broadcast rank
    0's pending points and available memory to every rank."""
    import torch.distributed as dist

    init_in_place(backend, timeout_s)
    box = [sorted(pending), available_bytes]
    dist.broadcast_object_list(box, src=0)
    return set(box[0]), box[1]


def schedule(points: dict[str, PointConfig], seed: int) -> dict[str, PointConfig]:
    """Run order: one pass per repetition (``repeat``), each pass in its own seeded shuffle, so a slow period
    of the machine hits every point of the sweep alike instead of a few neighbours, and a rerun (or a resume)
    keeps the order. Returns the points in that order."""
    passes: dict[int, list[str]] = {}
    for pid, cfg in points.items():
        passes.setdefault(getattr(cfg, "repeat", 0), []).append(pid)
    order = []
    for repeat, ids in sorted(passes.items()):
        random.Random(f"{seed}/{repeat}").shuffle(ids)
        order += ids
    return {pid: points[pid] for pid in order}


INTERLEAVED_FIELDS = ("impl", "bucket_cap_mb", "overlap", "sync_every", "round_robin_groups", "comm_hook",
                      "gradient_as_bucket_view")  # what points measured together may differ in
INTERLEAVED_IMPLS = ("ours", "torch", "local")  # systems that can share ranks with others (no global set-up)
MEMORY_SHARE = 0.5  # of the memory available when a group starts, for the group's trainers
# Parameter-sized tensors a trainer holds: weights, gradients and buckets, plus Adam's two moments (the runner's SGD
# has no momentum). Measured: BERT-base at 2 ranks, 1.35 GB a trainer and rank (3.1 copies).
TRAINER_COPIES = {"sgd": 3, "adam": 5}


def interleaved_groups(points: dict[str, PointConfig], available_bytes: float) -> list[list[str]]:
    """The points, in order, gathered into groups measured together (:func:`harness.runner.run_training_points`):
    training points of one repetition on the same ranks and network that differ only in
    :data:`INTERLEAVED_FIELDS`, each group placed where its first point was. A group too big for
    :data:`MEMORY_SHARE` of ``available_bytes`` is split into tasks that all measure one common point, the
    anchor (the one with the fields' defaults, e.g. torch's 25 MiB cap, else the first): two points of different
    tasks compare through their ratios to it (``experiments.verdicts.paired_ratios``), and the anchor's rows
    hold every task's. Points measuring memory, tracing buckets, with a fault or of another system run alone."""
    groups: dict[object, list[str]] = {}
    order: list[list[str]] = []
    for pid, cfg in points.items():
        if (not isinstance(cfg, TrainConfig) or cfg.memory or cfg.fault or cfg.trace_buckets
                or cfg.impl not in INTERLEAVED_IMPLS):
            order.append([pid])
            continue
        key = dataclasses.replace(cfg, **{f: TrainConfig.__dataclass_fields__[f].default for f in INTERLEAVED_FIELDS})
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(pid)
    return [task for members in order for task in _tasks(members, points, available_bytes)]


def _tasks(members: list[str], points: dict[str, PointConfig], available_bytes: float) -> list[list[str]]:
    if len(members) == 1:
        return [members]
    cfg = points[members[0]]
    trainer_bytes = cfg.world_size * TRAINER_COPIES[cfg.optimizer] * _param_bytes(cfg)
    size = int(MEMORY_SHARE * available_bytes // trainer_bytes)
    if len(members) <= size:
        return [members]
    if size < 2:
        return [[pid] for pid in members]
    defaults = TrainConfig()
    anchor = next((pid for pid in members if all(getattr(points[pid], f) == getattr(defaults, f)
                                                 for f in INTERLEAVED_FIELDS)), members[0])
    rest = [pid for pid in members if pid != anchor]
    return [[anchor, *rest[i:i + size - 1]] for i in range(0, len(rest), size - 1)]


def _param_bytes(cfg: TrainConfig) -> int:
    return model_param_bytes(cfg.model)


def run_sweep(experiment: str, points: Sequence[PointConfig], *, root: str | os.PathLike | None = None,
              dry_run: bool = False, retry_errors: bool = False, progress: bool = True,
              deadline_s: float | None = None, order_seed: int = 0) -> pd.DataFrame:
    """Run every point of ``experiment`` not yet stored, in :func:`schedule`'s order; return all stored rows.

    ``dry_run`` returns (and prints) one row per point: point_id, stored or pending, and its config.
    ``deadline_s`` bounds each spawned point's wall-clock time. ``root`` overrides the results folder.
    ``order_seed`` seeds the shuffle of each pass (stored with the rows, as is each point's ``run_position``).
    """
    refuse_in_bootstrapping_child()
    with refusing():  # every bad value raises here, before any launch
        resolved = [validate(p) for p in points]
    unique = _this_jobs_points(experiment, schedule({point_id(p): p for p in resolved}, order_seed))  # once each
    pending = _pending(experiment, list(unique), root, retry_errors)
    if dry_run:
        return _print_plan(unique, pending)
    with refusing():
        preflight(unique[pid] for pid in pending)  # the machine, once: GPUs, namespaces, data on disk
    writer, available = True, memory_bytes()[0]
    if in_place() and unique:
        first = next(iter(unique.values()))
        pending, available = _agree(pending, available, first.backend, first.timeout_s)
        writer = is_writer()
    todo = {pid: cfg for pid, cfg in unique.items() if pid in pending}
    tasks = interleaved_groups(todo, available)
    bar = tqdm(total=len(unique), desc=experiment, unit="point", disable=not (progress and writer),
               file=sys.stderr, dynamic_ncols=True)
    with bar, contextlib.ExitStack() as stack:
        pools = _Pools(stack)
        bar.update(len(unique) - len(pending))
        store = _PointStore(experiment, root, tasks, list(unique), writer, on_stored=lambda: bar.update(1))
        meta = {"git_commit": results.git_commit() if writer else ""}
        for task in tasks:
            cfgs = [todo[pid] for pid in task]
            bar.set_postfix_str(_describe(cfgs), refresh=True)
            measured, timing = _measure_task(experiment, task, cfgs, deadline_s, pools, writer)
            store.add(task, measured, {**meta, **timing, "order_seed": order_seed, "group": "+".join(task)})
    return results.load_results(experiment, root)


def _this_jobs_points(experiment: str, points: dict[str, PointConfig]) -> dict[str, PointConfig]:
    """Under torchrun, the points this job's WORLD_SIZE can run (the others skipped with a note, so one driver can
    serve jobs of several sizes); all of them elsewhere."""
    if not in_place():
        return points
    world = int(os.environ["WORLD_SIZE"])
    skipped = [pid for pid, p in points.items() if p.world_size != world]
    if skipped and is_writer():
        print(f"[{experiment}] skipping {len(skipped)} point(s) whose world_size != WORLD_SIZE={world}")
    return {pid: p for pid, p in points.items() if pid not in skipped}


def _print_plan(points: dict[str, PointConfig], pending: set[str]) -> pd.DataFrame:
    """A dry run: one row per point, stored or pending, with its config; printed and returned."""
    plan = pd.DataFrame([{"point_id": pid, "status": "pending" if pid in pending else "stored",
                          **config_columns(p)} for pid, p in points.items()])
    with pd.option_context("display.width", 200, "display.max_columns", 12):
        print(plan.to_string(index=False) if len(plan) else "no points")
    return plan


def _measure_task(experiment: str, task: list[str], cfgs: list[PointConfig], deadline_s, pools: _Pools,
                  writer: bool) -> tuple[list[list[dict]], dict]:
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


class _PointStore:
    """Each point's rows gathered over the tasks that measure it (an anchor is in several) and stored once its last
    task is done: the tasks that worked, or the error if it failed in all. Only the writer (rank 0) stores."""

    def __init__(self, experiment: str, root, tasks: list[list[str]], order: list[str], writer: bool, on_stored):
        self.experiment, self.root, self.writer, self.on_stored = experiment, root, writer, on_stored
        self.positions = {pid: position for position, pid in enumerate(order)}
        self.tasks_left = collections.Counter(pid for task in tasks for pid in task)
        self.collected: dict[str, list[dict]] = collections.defaultdict(list)

    def add(self, task: list[str], measured: list[list[dict]], meta: dict) -> None:
        for pid, rows in zip(task, measured):
            self.collected[pid] += [{**meta, "run_position": self.positions[pid], **row} for row in rows]
            self.tasks_left[pid] -= 1
            if self.tasks_left[pid] == 0:
                rows = self.collected.pop(pid)
                fine = [row for row in rows if not row.get("error")]
                if self.writer:
                    results.write_point(self.experiment, pid, fine or rows[:1], self.root)
                self.on_stored()


def _describe(cfgs: list[PointConfig]) -> str:
    cfg = cfgs[0]
    if isinstance(cfg, ConvergenceConfig):
        return f"{cfg.dataset} batch={cfg.batch_size} sync_every={cfg.sync_every} ranks={cfg.world_size}"
    if isinstance(cfg, AllreduceConfig):
        return f"allreduce {cfg.backend} n={cfg.world_size} k={cfg.params_per_call}"
    text = f"{cfg.model} {cfg.impl} {cfg.backend} n={cfg.world_size} cap={cfg.bucket_cap_mb}MB"
    return text if len(cfgs) == 1 else f"{cfg.model} {cfg.backend} n={cfg.world_size}, {len(cfgs)} interleaved"
