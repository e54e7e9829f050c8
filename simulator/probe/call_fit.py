"""Fitting the per-call latency and how much the calls' latency slows compute to the probe's calls inside backward:
the values with which the simulator reproduces when the last call finished and when backward's compute ended.
"""

from __future__ import annotations

from dataclasses import replace

from ..model.comm import AlphaBeta
from ..model.iteration import ComputeProfile, buckets_for, simulate

FIT_ROUNDS = 30  # at most, of fit_calls' turns


def latency_from_calls(
    profile: ComputeProfile, done_ms: float, world_size: int, concurrent: int = 1, beta_ms_per_byte: float = 0.0
) -> float:
    """The per-step latency alpha with which the simulator reproduces ``done_ms``: when the last of one
    allreduce per gradient (its size, at ``beta_ms_per_byte``), each launched as its gradient became ready,
    completed. 0 if the bytes alone already take that long."""
    buckets = buckets_for(profile, 0.0)  # one per gradient, in ready order

    def last_done(alpha_ms: float) -> float:
        comm = AlphaBeta(alpha_ms, beta_ms_per_byte)
        return max(simulate(profile, buckets, comm, world_size, concurrent=concurrent).done_ms)

    if world_size < 2 or last_done(0.0) >= done_ms:
        return 0.0
    hi = concurrent * done_ms / (2 * (world_size - 1))  # one call alone at hi already takes done_ms
    return _bisect(last_done, done_ms, hi, rel=1e-3)


def _bisect(fn, target: float, hi: float, rel: float = 0.0, abs_: float = 0.0) -> float:
    """The x in [0, hi] where the increasing ``fn`` reaches ``target``, to ``abs_`` or ``rel`` x the bracket's top."""
    lo = 0.0
    while hi - lo > max(abs_, rel * hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
    return (lo + hi) / 2


def latency_share_from_calls(
    profile: ComputeProfile, backward_ms: float, world_size: int, comm: AlphaBeta, concurrent: int = 1
) -> float:
    """The ``latency_contention`` with which the simulator's backward compute, beside one allreduce per gradient
    launched as each is ready, ends at ``backward_ms`` as measured (0 to 1; 0 without contention)."""
    buckets = buckets_for(profile, 0.0)

    def compute_end(share: float) -> float:
        return simulate(
            replace(profile, latency_contention=share), buckets, comm, world_size, concurrent=concurrent
        ).compute_end_ms

    if world_size < 2 or not profile.contention or compute_end(0.0) >= backward_ms:
        return 0.0
    if compute_end(1.0) <= backward_ms:
        return 1.0
    return _bisect(compute_end, backward_ms, 1.0, abs_=1e-3)


def fit_calls(
    profile: ComputeProfile,
    done_ms: float,
    backward_ms: float,
    world_size: int,
    concurrent: int = 1,
    beta_ms_per_byte: float = 0.0,
) -> tuple[float, float]:
    """``(alpha, latency_contention)`` from the probe's calls inside backward: alpha reproduces when the last call
    finished, the share when backward's compute ended beside them. Each moves the other (a slower compute readies
    gradients later, so the calls need less latency to end when they did): fitted in turn until both settle."""
    alpha, share = latency_from_calls(profile, done_ms, world_size, concurrent, beta_ms_per_byte), 0.0
    for _ in range(FIT_ROUNDS):
        share_now = latency_share_from_calls(
            profile, backward_ms, world_size, AlphaBeta(alpha, beta_ms_per_byte), concurrent
        )
        alpha_now = latency_from_calls(
            replace(profile, latency_contention=share_now), done_ms, world_size, concurrent, beta_ms_per_byte
        )
        settled = abs(share_now - share) <= 1e-3 and abs(alpha_now - alpha) <= 1e-3 * alpha
        alpha, share = alpha_now, share_now
        if settled:
            break
    return alpha, share
