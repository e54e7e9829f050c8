"""The order a sweep runs its points in, and which of them are measured together in one rank task.

Each repetition is one pass in a seeded shuffle (:func:`schedule`), so the machine's drift spreads over all points
instead of reading as an effect between neighbours; points that differ only in how they train share ranks
(:func:`interleaved_groups`), so that drift hits them alike, within the memory the machine has.
"""

from __future__ import annotations

import dataclasses
import random

from harness.config import AllreduceConfig, ConvergenceConfig, PointConfig, TrainConfig
from harness.preflight import model_param_bytes


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


INTERLEAVED_FIELDS = (
    "impl",
    "bucket_cap_mb",
    "autotune_prior_mb",
    "overlap",
    "sync_every",
    "round_robin_groups",
    "comm_hook",
    "gradient_as_bucket_view",
)  # what points measured together may differ in
INTERLEAVED_IMPLS = ("ours", "torch", "local")  # systems that can share ranks with others (no global set-up)
MEMORY_SHARE = 0.5  # of the memory available when a group starts, for the group's trainers
# Parameter-sized tensors a trainer holds: weights, gradients and buckets, plus Adam's two moments (the runner's SGD
# has no momentum). Measured: BERT-base at 2 ranks, 1.35 GB a trainer and rank (3.1 copies).
TRAINER_COPIES = {"sgd": 3, "adam": 5}


def interleaved_groups(points: dict[str, PointConfig], available_bytes: float) -> list[list[str]]:
    """The points, in order, gathered into groups measured together
    (:func:`harness.workloads.runner.run_training_points`): training points of one repetition on the same ranks
    and network that differ only in
    :data:`INTERLEAVED_FIELDS`, each group placed where its first point was. A group too big for
    :data:`MEMORY_SHARE` of ``available_bytes`` is split into tasks that all measure one common point, the
    anchor (the one with the fields' defaults, e.g. torch's 25 MiB cap, else the first): two points of different
    tasks compare through their ratios to it (``experiments.verdicts.paired_ratios``), and the anchor's rows
    hold every task's. Points measuring memory, tracing buckets, with a fault or of another system run alone."""
    groups: dict[object, list[str]] = {}
    order: list[list[str]] = []
    for pid, cfg in points.items():
        if (
            not isinstance(cfg, TrainConfig)
            or cfg.memory
            or cfg.fault
            or cfg.trace_buckets
            or cfg.impl not in INTERLEAVED_IMPLS
        ):
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
    anchor = next(
        (pid for pid in members if all(getattr(points[pid], f) == getattr(defaults, f) for f in INTERLEAVED_FIELDS)),
        members[0],
    )
    rest = [pid for pid in members if pid != anchor]
    return [[anchor, *rest[i : i + size - 1]] for i in range(0, len(rest), size - 1)]


def _param_bytes(cfg: TrainConfig) -> int:
    return model_param_bytes(cfg.model)


def describe(cfgs: list[PointConfig]) -> str:
    """What the progress bar says of the point (or interleaved points) being measured."""
    cfg = cfgs[0]
    if isinstance(cfg, ConvergenceConfig):
        return f"{cfg.dataset} batch={cfg.batch_size} sync_every={cfg.sync_every} ranks={cfg.world_size}"
    if isinstance(cfg, AllreduceConfig):
        return f"allreduce {cfg.backend} n={cfg.world_size} k={cfg.params_per_call}"
    text = f"{cfg.model} {cfg.impl} {cfg.backend} n={cfg.world_size} cap={cfg.bucket_cap_mb}MB"
    return text if len(cfgs) == 1 else f"{cfg.model} {cfg.backend} n={cfg.world_size}, {len(cfgs)} interleaved"
