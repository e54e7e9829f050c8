"""``make simval``'s grid: its settings, the points each calibration probe predicts, and their checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness import TrainConfig
from harness.config import validate
from harness.preflight import preflight

EXPERIMENT = "simval"


@dataclass(frozen=True)
class Config:
    """The validation grid; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")  # the models probed and measured (harness.workloads.models)
    # the default grid fits in 45 minutes on 2 cores with the statistics of the full one (3 rounds, every kind of
    # point); the full grid adds link rates 1 and 4 Gbit/s and 3 and 4 ranks: --nets=1gbit,2gbit,4gbit --world_sizes=3,4
    nets: tuple[str, ...] = ("2gbit",)  # link rates per rank: the caps/overlap/n/k grid at 2 ranks
    world_sizes: tuple[int, ...] = ()  # ranks at which scale_caps_mb are measured too, at scale_net (none by default)
    scale_net: str = "2gbit"  # the link per rank at world_sizes
    bucket_caps_mb: tuple[float, ...] = (0, 1, 5, 25, 100, 1000)  # caps (MiB) at world size 2, at each of nets
    scale_caps_mb: tuple[float, ...] = (0, 5, 25, 1000)  # caps (MiB) at world_sizes
    sync_every: tuple[int, ...] = (2, 4, 8)  # n of the no_sync points (synchronize 1 of every n iterations)
    round_robin_groups: tuple[int, ...] = (2, 3, 5)  # k of the round-robin points (at 5 MiB)
    iters: int = 4  # measured iterations per point (and the probe's compute iterations)
    warmup: int = 1  # iterations run before measuring, per point and probe
    no_sync_cycles: int = 3  # a no_sync point measures this many cycles of n iterations, after two
    # the whole grid again, each round with probes of its own (the host drifts within minutes); a point's median
    # over three rounds is not moved by one round's slow spell, as the mean of two was (1 and 5 MiB +25% in one)
    rounds: int = 3  # passes over the whole grid, each with probes of its own
    # glibc's allocator in the ranks, probes and points alike (harness.launch.allocator.MALLOC_ENV): with its
    # defaults, how many pages a backward faults in depends on the heap's history (BERT-base: 0 to 130k, backward
    # 410-650 ms), which differs between a probe's process and the points'; "retain" keeps freed memory, as CUDA's
    # allocator does
    malloc: str = "retain"  # glibc's allocator in probes and points: default | retain (freed memory kept)
    # the tuning check (:func:`confirm`): where the recommended cap is not the best measured one, both are measured
    # again in one rank task, an iteration of each in turn, this many times (0: the grid's ratio alone); ten, as
    # five read ResNet50 at 2 Gbit/s 1.024 [1.012, 1.067] one morning and 1.000 [0.997, 1.011] 2.5 h later
    confirm_repeats: int = 10  # tuning check: repetitions of the recommended and best caps side by side (0: none)
    confirm_iters: int = 8  # tuning check: measured iterations per repetition


TUNING_GOAL = 0.02  # the recommended cap's latency within 2% of the best measured cap's
CONFIRM_REPEAT = 100  # confirmation points' repeat numbers start here, apart from the rounds' (0, 1, 2, ...)


def groups(cfg: Config) -> list[tuple[TrainConfig, list[TrainConfig]]]:
    """(the point the probe runs as, the points it predicts) per (model, world size, link rate)."""
    out = []
    for model in cfg.models:
        base = TrainConfig(model=model, impl="ours", iters=cfg.iters, warmup=cfg.warmup, malloc=cfg.malloc)
        settings = [(2, net, cfg.bucket_caps_mb, True) for net in cfg.nets]
        settings += [(ws, cfg.scale_net, cfg.scale_caps_mb, False) for ws in cfg.world_sizes]
        for ws, net, caps, full in settings:
            probe = dataclasses.replace(base, world_size=ws, net=net)
            points = [dataclasses.replace(probe, bucket_cap_mb=cap) for cap in caps]
            if full:
                points.append(dataclasses.replace(probe, overlap=False))
                # warmup 2n: the first synchronized iteration and the next one, whose forward rebuilds the
                # buckets (ResNet50: 25k page faults, forward +55 ms), are not measured
                points += [
                    dataclasses.replace(probe, sync_every=n, iters=cfg.no_sync_cycles * n, warmup=2 * n)
                    for n in cfg.sync_every
                ]
                points += [
                    dataclasses.replace(probe, bucket_cap_mb=5, round_robin_groups=k) for k in cfg.round_robin_groups
                ]
            out.append((probe, points))
    return out


def check(cfg: Config) -> None:
    """Every setting checked before the first probe (ValueError naming the first bad one): a bad value in a later
    group would otherwise stop the run after hours."""
    for name in ("rounds", "iters", "no_sync_cycles", "confirm_iters"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name}={getattr(cfg, name)}: needs at least 1")
    if cfg.confirm_repeats < 0:
        raise ValueError(f"confirm_repeats={cfg.confirm_repeats}: needs 0 or more")
    if not cfg.models or not (cfg.nets or cfg.world_sizes):
        raise ValueError("give at least one model and one of nets or world_sizes")
    points = [validate(p) for probe, group in groups(cfg) for p in (probe, *group)]
    preflight(points)
