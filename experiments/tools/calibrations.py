"""This machine's calibrations, shared by predict, tune, simval and hostval: where each point's is stored, and for a
point a given one checked, a stored one refreshed, or a fresh probe."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import sys
import time
from pathlib import Path

from harness import TrainConfig
from harness.config import validate
from harness.results import results_root

# A probe's compute iterations and warm-ups, by device. On CPU an iteration takes 50 ms to 2 s and the contention
# pairs add more; on a GPU it takes tens of ms, and 3 after 1 warm-up read BERT-base's forward on an H100 at 16.2 ms
# where fig7 had measured 9.7 ms a minute before (BENCHMARKS.md, "make gpu-check").
PROBE_ITERS = {"cpu": (3, 1), "cuda": (20, 5)}
CALIBRATION_DIR = "calibration"
REFRESH_HOURS = 24.0  # a stored full probe younger than this is refreshed (compute only) instead of redone
# what a stored calibration must share with the point it predicts (malloc: glibc's default before the field)
CALIBRATION_KEYS = (
    "model",
    "profile",
    "batch_size",
    "world_size",
    "backend",
    "net",
    "hosts",
    "threads_per_rank",
    "malloc",
)


def calibration_path(cfg: TrainConfig, root=None) -> Path:
    """One file per (model, profile, batch, ranks, backend, network, hosts, threads, allocator) on this machine."""
    import socket

    cfg = validate(cfg)  # auto profile and backend made concrete
    net = cfg.net.replace("/", "_")
    malloc = "" if cfg.malloc == "default" else f"-{cfg.malloc}"
    hosts = "" if cfg.hosts == 1 else f"-h{cfg.hosts}"
    name = (
        f"{cfg.model}-{cfg.profile}-b{cfg.batch_size}-n{cfg.world_size}-{cfg.backend}-{net}{hosts}"
        f"-t{cfg.threads_per_rank}{malloc}-{socket.gethostname()}.json"
    )
    return Path(results_root(root)) / CALIBRATION_DIR / name


def probe_point(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its device's probe iterations (NCCL ranks run on GPUs, Gloo ranks on the CPU)."""
    iters, warmup = PROBE_ITERS["cuda" if validate(cfg).backend == "nccl" else "cpu"]
    return dataclasses.replace(cfg, iters=iters, warmup=warmup)


def calibration_for(cfg: TrainConfig, stored: str = "", root=None, probe: str = "auto"):
    """``stored`` (a path) if given, after checking it describes ``cfg``'s model and ranks; else this point's stored
    calibration with its compute re-timed, if a full probe of it is younger than ``REFRESH_HOURS`` and ``probe`` is
    "auto"; else a fresh full probe."""
    from harness.workloads.runner import machine_metadata
    from simulator.model.calibration import Calibration
    from simulator.probe.calibrate import calibrate, refresh

    if stored:
        cal = _load(stored)
        for key in CALIBRATION_KEYS:
            probed = cal.point.get(key, getattr(TrainConfig(), key))  # fields added since: their default then
            if probed != getattr(cfg, key):
                raise ValueError(
                    f"calibration {stored} was probed with {key}={probed!r}, but the point "
                    f"asks for {key}={getattr(cfg, key)!r}; probe again (leave out --calibration)"
                )
        return cal, Path(stored)
    path, short = calibration_path(cfg, root), probe_point(cfg)
    if probe == "auto" and path.exists():
        try:
            cal = Calibration.load(path)
        except ValueError:  # another calibration version's: probe again
            cal = None
        if (
            cal is not None
            and _hours_since(cal.meta.get("probed_at", cal.meta["created_at"])) < REFRESH_HOURS
            and all(cal.meta.get(k) == v for k, v in machine_metadata().items())
        ):  # same host and torch
            with announced(f"re-timing the compute of {path.name} (a few seconds)"):
                cal = refresh(cal, short)
            return cal, cal.save(path)
    with announced(
        f"probing {cfg.model} on {cfg.world_size} rank(s) ({cfg.backend}, net={cfg.net}) on this machine: "
        "the link, calls inside backward, compute (20-45 s for ResNet50, 50-120 s for BERT-base)"
    ):
        cal = calibrate(short, root)
    return cal, cal.save(path)


@contextlib.contextmanager
def announced(what: str, prog: str = "predict"):
    """One line on stderr before long work and one with its duration after: probes show no bar of their own."""
    print(f"[{prog}] {what} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    yield
    print(f"[{prog}] done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


def _load(stored: str):
    """A calibration file given on the command line, or a ValueError saying why it cannot be used."""
    from simulator.model.calibration import Calibration

    try:
        return Calibration.load(stored)
    except OSError as exc:
        raise ValueError(
            f"calibration {stored!r}: {exc.strerror or exc}; name a file that `predict` stored under "
            f"results/{CALIBRATION_DIR}/, or leave out --calibration to probe now"
        ) from exc
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"calibration {stored!r} is not a calibration file ({type(exc).__name__}: {exc}); "
            "leave out --calibration to probe now"
        ) from exc


def _hours_since(iso: str) -> float:
    """Hours since an ISO time (UTC if it names no zone); infinite for one that cannot be read."""
    try:
        then = datetime.datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return math.inf
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds() / 3600
