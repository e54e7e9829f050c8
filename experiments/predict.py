"""Predict a DDP point's per-iteration latency instead of measuring it.

    python -m experiments predict --model=resnet50 --world_size=3 --bucket_cap_mb=10 --net=700mbit
    python -m experiments predict --model=bert-base --bucket_cap_mb=100 --json
    python -m experiments predict --calibration=results/calibration/....json --bucket_cap_mb=5
    python -m experiments predict --cluster=paper-v100 --world_size=256 --backend=nccl --model=bert-base

The point options are those of the figure drivers (``TrainConfig``) that a prediction reads (``PREDICTED``, what
``--help`` lists); another implementation than ours or torch's DDP, and any other option set away from its default,
are refused rather than ignored. Without ``--calibration`` a probe
(:mod:`simulator.calibrate`) measures this machine now, on the point's own ranks and network, and is stored under
``results/calibration/``; the prediction names the calibration it used. The link's cost per byte comes from
``make fig2``'s allreduce microbenchmark: its stored calls where they ran on this very link (same backend, ranks,
host and link rate: e.g. ``make fig2 ARGS="--world_sizes=3 --net=700mbit"`` before the example above), else the
probe runs the same microbenchmark itself. The full probe takes 20-45 s for ResNet50
and 50-120 s for BERT-base (the link, calls inside backward, compute under communication). Within
``REFRESH_HOURS`` of a stored full probe of the same point, only what drifts is measured again (``--probe=auto``,
the default: compute timed after DDP's own iterations, :func:`simulator.calibrate.refresh`; the link's numbers and
the contentions stay as probed); ``--probe=full`` probes everything again.
``--cluster=NAME`` predicts for a named GPU cluster instead (:mod:`simulator.clusters`: its numbers and their
sources; paper-profile batches, ``--net`` and ``--profile`` do not apply, ``--backend=auto`` means NCCL), with the
range its assumptions' stated ranges give (``predicted_range_ms`` in the JSON).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import sys
import time
from pathlib import Path

from harness import TrainConfig, add_dataclass_arguments, dataclass_from_namespace
from harness.config import OneLineParser, validate
from harness.errors import command_line, refusing
from harness.results import results_root

# A probe's compute iterations and warm-ups, by device. On CPU an iteration takes 50 ms to 2 s and the contention
# pairs add more; on a GPU it takes tens of ms, and 3 after 1 warm-up read BERT-base's forward on an H100 at 16.2 ms
# where fig7 had measured 9.7 ms a minute before (BENCHMARKS.md, "make gpu-check").
PROBE_ITERS = {"cpu": (3, 1), "cuda": (20, 5)}
CALIBRATION_DIR = "calibration"
REFRESH_HOURS = 24.0  # a stored full probe younger than this is refreshed (compute only) instead of redone
DDP_IMPLS = ("ours", "torch")
# the point options a prediction reads: what its calibration is probed with (and its group timeout) and the scenario
# it simulates. The
# others are left out of --help and refused at any value but their default, rather than ignored
PREDICTED = ("model", "impl", "profile", "backend", "world_size", "batch_size", "bucket_cap_mb", "overlap",
             "sync_every", "round_robin_groups", "threads_per_rank", "net", "hosts", "malloc", "timeout_s")
# what a stored calibration must share with the point it predicts (malloc: glibc's default before the field)
CALIBRATION_KEYS = ("model", "profile", "batch_size", "world_size", "backend", "net", "hosts", "threads_per_rank",
                    "malloc")


def calibration_path(cfg: TrainConfig, root=None) -> Path:
    """One file per (model, profile, batch, ranks, backend, network, hosts, threads, allocator) on this machine."""
    import socket

    cfg = validate(cfg)  # auto profile and backend made concrete
    net = cfg.net.replace("/", "_")
    malloc = "" if cfg.malloc == "default" else f"-{cfg.malloc}"
    hosts = "" if cfg.hosts == 1 else f"-h{cfg.hosts}"
    name = (f"{cfg.model}-{cfg.profile}-b{cfg.batch_size}-n{cfg.world_size}-{cfg.backend}-{net}{hosts}"
            f"-t{cfg.threads_per_rank}{malloc}-{socket.gethostname()}.json")
    return Path(results_root(root)) / CALIBRATION_DIR / name


def modelled(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` if the simulation models every option it sets; else a ValueError naming the first it would ignore."""
    if cfg.impl not in DDP_IMPLS:
        raise ValueError(f"impl={cfg.impl!r}: predict models DDP's buckets ({' or '.join(DDP_IMPLS)}), not this system")
    for f in dataclasses.fields(cfg):
        if f.name not in PREDICTED and getattr(cfg, f.name) != f.default:
            raise ValueError(f"{f.name}={getattr(cfg, f.name)!r}: predict does not model it (it reads only the "
                             f"options --help lists); leave it out")
    return cfg


def probe_point(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its device's probe iterations (NCCL ranks run on GPUs, Gloo ranks on the CPU)."""
    iters, warmup = PROBE_ITERS["cuda" if validate(cfg).backend == "nccl" else "cpu"]
    return dataclasses.replace(cfg, iters=iters, warmup=warmup)


def calibration_for(cfg: TrainConfig, stored: str = "", root=None, probe: str = "auto"):
    """``stored`` (a path) if given, after checking it describes ``cfg``'s model and ranks; else this point's stored
    calibration with its compute re-timed, if a full probe of it is younger than ``REFRESH_HOURS`` and ``probe`` is
    "auto"; else a fresh full probe."""
    from harness.runner import machine_metadata
    from simulator.calibrate import Calibration, calibrate, refresh

    if stored:
        cal = _load(stored)
        for key in CALIBRATION_KEYS:
            probed = cal.point.get(key, getattr(TrainConfig(), key))  # fields added since: their default then
            if probed != getattr(cfg, key):
                raise ValueError(f"calibration {stored} was probed with {key}={probed!r}, but the point "
                                 f"asks for {key}={getattr(cfg, key)!r}; probe again (leave out --calibration)")
        return cal, Path(stored)
    path, short = calibration_path(cfg, root), probe_point(cfg)
    if probe == "auto" and path.exists():
        try:
            cal = Calibration.load(path)
        except ValueError:  # another calibration version's: probe again
            cal = None
        if (cal is not None and _hours_since(cal.meta.get("probed_at", cal.meta["created_at"])) < REFRESH_HOURS
                and all(cal.meta.get(k) == v for k, v in machine_metadata().items())):  # same host and torch
            with announced(f"re-timing the compute of {path.name} (a few seconds)"):
                cal = refresh(cal, short)
            return cal, cal.save(path)
    with announced(f"probing {cfg.model} on {cfg.world_size} rank(s) ({cfg.backend}, net={cfg.net}) on this machine: "
                   "the link, calls inside backward, compute (20-45 s for ResNet50, 50-120 s for BERT-base)"):
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
    from simulator.calibrate import Calibration

    try:
        return Calibration.load(stored)
    except OSError as exc:
        raise ValueError(f"calibration {stored!r}: {exc.strerror or exc}; name a file that `predict` stored under "
                         f"results/{CALIBRATION_DIR}/, or leave out --calibration to probe now") from exc
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"calibration {stored!r} is not a calibration file ({type(exc).__name__}: {exc}); "
                         "leave out --calibration to probe now") from exc


def _hours_since(iso: str) -> float:
    """Hours since an ISO time (UTC if it names no zone); infinite for one that cannot be read."""
    try:
        then = datetime.datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return math.inf
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds() / 3600


def main(argv: list[str] | None = None) -> int:
    return command_line("python -m experiments predict", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="python -m experiments predict", description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, TrainConfig, defaults=dict(model="resnet50"),
                            hidden=[f.name for f in dataclasses.fields(TrainConfig) if f.name not in PREDICTED])
    parser.add_argument("--calibration", default="", help="a stored calibration file (default: probe now)")
    parser.add_argument("--probe", choices=("auto", "full"), default=None,
                        help=f"auto (default): re-time only the compute of this point's stored probe if younger than "
                             f"{REFRESH_HOURS:g} h, else probe in full; full: always probe in full")
    parser.add_argument("--cluster", default="", help="a named GPU cluster (simulator/clusters.py) instead of this "
                        "machine, e.g. paper-v100 (default: this machine)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (predicted_ms, breakdown)")
    ns = parser.parse_args(argv)
    with refusing():
        cfg = modelled(dataclass_from_namespace(TrainConfig, ns))
        if ns.cluster:
            from simulator.clusters import cluster_calibration

            if ns.calibration or ns.probe:
                raise ValueError("--calibration or --probe and --cluster exclude each other: a calibration is this "
                                 "machine's")
            cfg = validate(dataclasses.replace(cfg, backend="nccl" if cfg.backend == "auto" else cfg.backend))
            cal, path = cluster_calibration(ns.cluster, cfg.model, cfg.backend, cfg.world_size), ns.cluster
        else:
            cfg = validate(cfg)
            if ns.calibration and ns.probe:
                raise ValueError("--calibration and --probe exclude each other: a given calibration is used as it is")
            cal, path = calibration_for(cfg, ns.calibration, probe=ns.probe or "auto")
    from simulator.predict import Scenario, predict

    scenario = Scenario(bucket_cap_mb=cfg.bucket_cap_mb, overlap=cfg.overlap,
                        round_robin_groups=cfg.round_robin_groups, sync_every=cfg.sync_every)
    out = dict(predict(cal, scenario), calibration=str(path), calibrated_at=cal.meta["created_at"],
               probed_at=cal.meta.get("probed_at", cal.meta["created_at"]),
               point={**cal.point, **dataclasses.asdict(scenario)})
    if ns.cluster:  # the range each stated assumption's low and high ends give
        from simulator.clusters import band, cluster_calibration

        lo, _, hi = band(lambda at: predict(cluster_calibration(ns.cluster, cfg.model, cfg.backend, cfg.world_size,
                                                                at=at), scenario)["predicted_ms"])
        out["predicted_range_ms"] = [lo, hi]
    if ns.json:
        print(json.dumps(out))
        return 0
    p = out["point"]
    link = f"{p['net_rate_mbit']:.0f} Mbit/s per rank" if p["net_rate_mbit"] else "loopback"
    if ns.cluster:
        link = f"{p['gpus_per_host']} {p['device']} per server, ring at {p['net_rate_mbit'] / 1e3:.0f} Gbit/s"
    print(f"{p['model']} on {p['world_size']} ranks ({p['backend']}, net={p['net']}: {link}), "
          f"cap {scenario.bucket_cap_mb:g} MiB, "
          f"overlap={scenario.overlap}, k={scenario.round_robin_groups}, sync every {scenario.sync_every}")
    print(f"predicted per-iteration latency: {out['predicted_ms']:.1f} ms")
    if "predicted_range_ms" in out:
        lo, hi = out["predicted_range_ms"]
        print(f"  range {lo:.1f} - {hi:.1f} ms over the stated ranges of compute, link bandwidth and DDP's host work")
    for key in ("forward_ms", "backward_compute_ms", "host_ms", "exposed_comm_ms", "optimizer_ms", "comm_ms"):
        print(f"  {key:22s} {out[key]:9.1f}")
    print(f"  {'buckets':22s} {out['num_buckets']:9d}")
    probed = f"; link, latency and contention probed {cal.meta['probed_at']}" if "probed_at" in cal.meta else ""
    print(f"calibration: {path} ({cal.meta['created_at']}{probed}, alpha {cal.comm.alpha_ms:.3f} ms, "
          f"{cal.comm.busbw_gbit:.2f} Gbit/s, contention {cal.profile.contention:.2f})")
    if "link_fit" in cal.fit:  # calibrations before it name neither
        ring = cal.fit["link_fit"]
        print(f"link: {cal.fit['link']}, {cal.fit['samples']} samples; their ring fit: alpha "
              f"{ring['alpha_ms']:.3f} ms, {ring['gbit_per_s']:.2f} Gbit/s, R^2 {ring['r2']:.4f}, error median "
              f"{ring['median_abs_pct_error']:.1f}% / worst {ring['worst_abs_pct_error']:.1f}%; alpha above is the "
              f"per-call cost inside backward")
    if ns.cluster:
        print("simulated from measurements made elsewhere, not measured here; sources:\n  - "
              + "\n  - ".join(cal.meta["sources"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
