"""Predict a DDP point's per-iteration latency instead of measuring it.

    python -m experiments predict --model=resnet50 --world_size=3 --bucket_cap_mb=10 --net=700mbit
    python -m experiments predict --model=bert-base --bucket_cap_mb=100 --json
    python -m experiments predict --calibration=results/calibration/....json --bucket_cap_mb=5
    python -m experiments predict --cluster=paper-v100 --world_size=256 --backend=nccl --model=bert-base

The point options are those of the figure drivers (``TrainConfig``) that a prediction reads (``PREDICTED``, what
``--help`` lists); another implementation than ours or torch's DDP, and any other option set away from its default,
are refused rather than ignored. Without ``--calibration`` a probe
(:mod:`simulator.probe.calibrate`) measures this machine now, on the point's own ranks and network, and is stored under
``results/calibration/``; the prediction names the calibration it used. The link's cost per byte comes from
``make fig2``'s allreduce microbenchmark: its stored calls where they ran on this very link (same backend, ranks,
host and link rate: e.g. ``make fig2 ARGS="--world_sizes=3 --net=700mbit"`` before the example above), else the
probe runs the same microbenchmark itself. The full probe takes 20-45 s for ResNet50
and 50-120 s for BERT-base (the link, calls inside backward, compute under communication). Within
``REFRESH_HOURS`` of a stored full probe of the same point, only what drifts is measured again (``--probe=auto``,
the default: compute timed after DDP's own iterations, :func:`simulator.probe.calibrate.refresh`; the link's numbers and
the contentions stay as probed); ``--probe=full`` probes everything again.
``--cluster=NAME`` predicts for a named GPU cluster instead (:mod:`simulator.model.clusters`: its numbers and their
sources; paper-profile batches, ``--net`` and ``--profile`` do not apply, ``--backend=auto`` means NCCL), with the
range its assumptions' stated ranges give (``predicted_range_ms`` in the JSON).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from experiments.tools.calibrations import REFRESH_HOURS, calibration_for
from harness import TrainConfig, add_dataclass_arguments, dataclass_from_namespace
from harness.cli import OneLineParser
from harness.config import validate
from harness.launch.errors import command_line, refusing

DDP_IMPLS = ("ours", "torch")
# the point options a prediction reads: what its calibration is probed with (and its group timeout) and the scenario
# it simulates. The
# others are left out of --help and refused at any value but their default, rather than ignored
PREDICTED = (
    "model",
    "impl",
    "profile",
    "backend",
    "world_size",
    "batch_size",
    "bucket_cap_mb",
    "overlap",
    "sync_every",
    "round_robin_groups",
    "threads_per_rank",
    "net",
    "hosts",
    "malloc",
    "timeout_s",
)


def modelled(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` if the simulation models every option it sets; else a ValueError naming the first it would ignore."""
    if cfg.impl not in DDP_IMPLS:
        raise ValueError(f"impl={cfg.impl!r}: predict models DDP's buckets ({' or '.join(DDP_IMPLS)}), not this system")
    for f in dataclasses.fields(cfg):
        if f.name not in PREDICTED and getattr(cfg, f.name) != f.default:
            raise ValueError(
                f"{f.name}={getattr(cfg, f.name)!r}: predict does not model it (it reads only the "
                f"options --help lists); leave it out"
            )
    return cfg


def main(argv: list[str] | None = None) -> int:
    return command_line("python -m experiments predict", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    ns = _parser().parse_args(argv)
    with refusing():
        cfg, cal, path = _calibrated(ns)
    out, scenario = _prediction(ns, cfg, cal, path)
    if ns.json:
        print(json.dumps(out))
        return 0
    _print_prediction(out, scenario, ns.cluster)
    _print_calibration(cal, path, ns.cluster)
    return 0


def _parser() -> OneLineParser:
    """The point options a prediction reads (the others hidden), and where its calibration comes from."""
    parser = OneLineParser(prog="python -m experiments predict", description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(
        parser,
        TrainConfig,
        defaults=dict(model="resnet50"),
        hidden=[f.name for f in dataclasses.fields(TrainConfig) if f.name not in PREDICTED],
    )
    parser.add_argument("--calibration", default="", help="a stored calibration file (default: probe now)")
    parser.add_argument(
        "--probe",
        choices=("auto", "full"),
        default=None,
        help=f"auto (default): re-time only the compute of this point's stored probe if younger than "
        f"{REFRESH_HOURS:g} h, else probe in full; full: always probe in full",
    )
    parser.add_argument(
        "--cluster",
        default="",
        help="a named GPU cluster (simulator/model/clusters.py) instead of "
        "this machine, e.g. paper-v100 (default: this machine)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (predicted_ms, breakdown)")
    return parser


def _calibrated(ns) -> tuple:
    """(the point, its calibration, where that came from): a named cluster's, or this machine's; a ValueError for
    options that exclude each other."""
    cfg = modelled(dataclass_from_namespace(TrainConfig, ns))
    if ns.cluster:
        from simulator.probe.flops import counted_cluster_calibration

        if ns.calibration or ns.probe:
            raise ValueError(
                "--calibration or --probe and --cluster exclude each other: a calibration is this machine's"
            )
        cfg = validate(dataclasses.replace(cfg, backend="nccl" if cfg.backend == "auto" else cfg.backend))
        return cfg, counted_cluster_calibration(ns.cluster, cfg.model, cfg.backend, cfg.world_size), ns.cluster
    cfg = validate(cfg)
    if ns.calibration and ns.probe:
        raise ValueError("--calibration and --probe exclude each other: a given calibration is used as it is")
    cal, path = calibration_for(cfg, ns.calibration, probe=ns.probe or "auto")
    return cfg, cal, path


def _prediction(ns, cfg: TrainConfig, cal, path) -> tuple:
    """(the prediction with where its calibration came from, and for a cluster its range; the scenario simulated)."""
    from simulator.model.scenario import Scenario, predict

    scenario = Scenario(
        bucket_cap_mb=cfg.bucket_cap_mb,
        overlap=cfg.overlap,
        round_robin_groups=cfg.round_robin_groups,
        sync_every=cfg.sync_every,
    )
    out = dict(
        predict(cal, scenario),
        calibration=str(path),
        calibrated_at=cal.meta["created_at"],
        probed_at=cal.meta.get("probed_at", cal.meta["created_at"]),
        point={**cal.point, **dataclasses.asdict(scenario)},
    )
    if ns.cluster:  # the range each stated assumption's low and high ends give
        from simulator.model.clusters import band
        from simulator.probe.flops import counted_cluster_calibration

        lo, _, hi = band(
            lambda at: predict(
                counted_cluster_calibration(ns.cluster, cfg.model, cfg.backend, cfg.world_size, at=at), scenario
            )["predicted_ms"]
        )
        out["predicted_range_ms"] = [lo, hi]
    return out, scenario


def _print_prediction(out: dict, scenario, cluster: str) -> None:
    """The point, its predicted latency and where that goes."""
    p = out["point"]
    link = f"{p['net_rate_mbit']:.0f} Mbit/s per rank" if p["net_rate_mbit"] else "loopback"
    if cluster:
        link = f"{p['gpus_per_host']} {p['device']} per server, ring at {p['net_rate_mbit'] / 1e3:.0f} Gbit/s"
    print(
        f"{p['model']} on {p['world_size']} ranks ({p['backend']}, net={p['net']}: {link}), "
        f"cap {scenario.bucket_cap_mb:g} MiB, "
        f"overlap={scenario.overlap}, k={scenario.round_robin_groups}, sync every {scenario.sync_every}"
    )
    print(f"predicted per-iteration latency: {out['predicted_ms']:.1f} ms")
    if "predicted_range_ms" in out:
        lo, hi = out["predicted_range_ms"]
        print(f"  range {lo:.1f} - {hi:.1f} ms over the stated ranges of compute, link bandwidth and DDP's host work")
    for key in ("forward_ms", "backward_compute_ms", "host_ms", "exposed_comm_ms", "optimizer_ms", "comm_ms"):
        print(f"  {key:22s} {out[key]:9.1f}")
    print(f"  {'buckets':22s} {out['num_buckets']:9d}")


def _print_calibration(cal, path, cluster: str) -> None:
    """The calibration the prediction used, its link's fit, and for a cluster the sources of its numbers."""
    probed = f"; link, latency and contention probed {cal.meta['probed_at']}" if "probed_at" in cal.meta else ""
    print(
        f"calibration: {path} ({cal.meta['created_at']}{probed}, alpha {cal.comm.alpha_ms:.3f} ms, "
        f"{cal.comm.busbw_gbit:.2f} Gbit/s, contention {cal.profile.contention:.2f})"
    )
    if "link_fit" in cal.fit:  # calibrations before it name neither
        ring = cal.fit["link_fit"]
        print(
            f"link: {cal.fit['link']}, {cal.fit['samples']} samples; their ring fit: alpha "
            f"{ring['alpha_ms']:.3f} ms, {ring['gbit_per_s']:.2f} Gbit/s, R^2 {ring['r2']:.4f}, error median "
            f"{ring['median_abs_pct_error']:.1f}% / worst {ring['worst_abs_pct_error']:.1f}%; alpha above is the "
            f"per-call cost inside backward"
        )
    if cluster:
        print(
            "simulated from measurements made elsewhere, not measured here; sources:\n  - "
            + "\n  - ".join(cal.meta["sources"])
        )


if __name__ == "__main__":
    sys.exit(main())
