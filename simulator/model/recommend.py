"""Recommend a bucket cap from a calibration, robust to what a probe measures least surely.

The nominal curve's minimum often sits on a near-tie (ResNet50 at 4 Gbit/s: 1 MiB predicted 0.1% ahead of
5 MiB, then measured 7% behind it) that the least certain inputs decide: the per-call cost alpha (probes of one
machine read it up to 2x apart) and how much compute and communication slow each other (the contentions). So
every cap is scored by its regret, its predicted latency over the best cap's, in the worst of the calibrations
made by scaling alpha by :data:`ALPHA_FACTORS` and both contentions by :data:`CONTENTION_FACTORS`; the cap whose
worst regret is least wins (minimax regret). Where one cap is clearly best, that is the nominal minimum.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from .calibration import Calibration
from .comm import AlphaBeta, CommModel, TwoTier
from .scenario import Scenario, predict

ALPHA_FACTORS = (0.5, 1.0, 2.0)
CONTENTION_FACTORS = (0.5, 1.0, 1.5)


@dataclass(frozen=True)
class Recommendation:
    """``predicted_ms``: the nominal curve; ``regret``: each cap's worst ratio to the best cap over the scaled
    calibrations; ``band_ms``: each cap's lowest and highest prediction over them."""

    cap_mb: float
    predicted_ms: dict[float, float]
    regret: dict[float, float]
    band_ms: dict[float, tuple[float, float]]


def with_alpha_scaled(comm: CommModel, factor: float) -> CommModel:
    if isinstance(comm, AlphaBeta):
        return replace(comm, alpha_ms=comm.alpha_ms * factor)
    if isinstance(comm, TwoTier):
        return replace(comm, intra=with_alpha_scaled(comm.intra, factor), inter=with_alpha_scaled(comm.inter, factor))
    raise TypeError(f"cannot scale the latency of {type(comm).__name__}")


def recommend(cal: Calibration, caps_mb, scenario: Scenario = Scenario()) -> Recommendation:
    """The minimax-regret cap among ``caps_mb`` for ``scenario`` (its cap ignored); ties go to the lower nominal
    prediction."""
    caps = list(dict.fromkeys(caps_mb))
    if not caps:
        raise ValueError("recommend needs at least one bucket cap")
    curves = {}
    for a, c in itertools.product(ALPHA_FACTORS, CONTENTION_FACTORS):
        p = cal.profile
        scaled = replace(
            cal,
            comm=with_alpha_scaled(cal.comm, a),
            profile=replace(p, contention=p.contention * c, comm_contention=p.comm_contention * c),
        )
        curves[a, c] = {cap: predict(scaled, replace(scenario, bucket_cap_mb=cap))["predicted_ms"] for cap in caps}
    nominal = curves[1.0, 1.0]
    regret = {cap: max(curve[cap] / min(curve.values()) for curve in curves.values()) for cap in caps}
    band = {
        cap: (min(curve[cap] for curve in curves.values()), max(curve[cap] for curve in curves.values()))
        for cap in caps
    }
    return Recommendation(least_regret(regret, nominal), nominal, regret, band)


def least_regret(regret: dict[float, float], nominal: dict[float, float]) -> float:
    """The cap with the least worst regret; ties go to the lower nominal prediction."""
    return min(regret, key=lambda cap: (round(regret[cap], 6), nominal[cap]))
