"""One H100's measurements: its stored compute profile, torch's DDP against no DDP on it, and DDP's host overhead
fitted to them, from which :mod:`simulator.model.cluster_data` builds the H100 cluster and every cluster's host cost.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from .iteration import ComputeProfile, buckets_for

STORED_PROFILE = Path(__file__).with_name("h100_compute_profile.json")  # one H100, no DDP: its "source" says how

# torch's DDP against no DDP, NCCL, one rank on one H100 (BENCHMARKS.md, "On a GPU: one H100, before the host-side
# changes above": 100 interleaved rounds, medians): model -> {bucket cap MiB: (no DDP ms, torch's DDP ms)}. ResNet50's
# rows calibrate the host overhead, BERT-base's validate it.
H100_DDP = {"resnet50": {1: (26.5, 36.8), 25: (27.7, 34.9)}, "bert-base": {1: (34.0, 46.8), 25: (34.0, 40.4)}}
# The same, from another H100 a day later (`make gpu-check`, BENCHMARKS.md: its bench's 20 interleaved rounds,
# torch 2.11): a second run, which validates only.
H100_DDP_CHECK = {"resnet50": {1: (28.3, 40.0), 25: (28.0, 33.1)}, "bert-base": {1: (35.8, 50.3), 25: (38.6, 45.9)}}
HOST_CALIBRATION_MODEL = "resnet50"


@functools.lru_cache(maxsize=None)
def _stored_profiles() -> dict:
    return json.loads(STORED_PROFILE.read_text())


def _h100_profile(model: str, mode: str) -> ComputeProfile:
    """The stored H100 profile of ``model`` as a compute-only profile (ready times clipped to backward's end)."""
    p = _stored_profiles()["profiles"][mode][model]
    return ComputeProfile(
        param_bytes=tuple(4 * n for n in p["numel"]),
        ready_ms=tuple(min(r, p["backward_ms"]) for r in p["ready_ms"]),
        backward_ms=p["backward_ms"],
        forward_ms=p["forward_ms"],
        optimizer_ms=p["optimizer_ms"],
    )


def fit_host_overhead(model: str = HOST_CALIBRATION_MODEL, memory_gbyte_s: float = 3350.0) -> tuple[float, float]:
    """``(ms per gradient, ms per bucket)`` with which torch's DDP minus no DDP on one H100 (:data:`H100_DDP`, two
    bucket caps of ``model``) is the model's: each cap's difference is the copies into and out of buckets at
    ``memory_gbyte_s`` plus the gradients' and the buckets' costs (one rank: no communication)."""
    profile = _h100_profile(model, "default")
    n, copies = len(profile.param_bytes), 2 * 2 * sum(profile.param_bytes) / (memory_gbyte_s * 1e6)
    caps = sorted(H100_DDP[model])
    a = np.array([[n, len(buckets_for(profile, cap))] for cap in caps], dtype=float)
    b = np.array([ddp - alone - copies for alone, ddp in (H100_DDP[model][cap] for cap in caps)])
    per_gradient, per_bucket = np.linalg.solve(a, b)
    return float(per_gradient), float(per_bucket)
