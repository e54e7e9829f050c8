"""Allreduce cost models: how long one allreduce of ``nbytes`` takes on ``world_size`` ranks.

A ring allreduce (NCCL's and gloo's ring) takes 2(p-1) steps, each sending a chunk of n/p bytes over every link
at once, so one call costs ``2(p-1)*alpha + 2(p-1)/p * n * beta`` (Thakur et al., 2005). ``alpha`` (latency per
step) and ``beta`` (time per byte on one link) are what a calibration fits from measured calls (``fit_ring``);
``TwoTier`` extends the ring to clusters whose hosts talk over a slower network than their GPUs do.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Protocol

import numpy as np

from ddp_impl.options import MIB


def concurrent_calls(backend: str) -> int:
    """Calls one process group runs at once: Gloo's runs each on one of its 2 worker threads (``threads{2}`` in
    torch's ProcessGroupGloo options), NCCL's queue them on one stream."""
    return 2 if backend == "gloo" else 1


class CommModel(Protocol):
    """What the simulator needs: a cost affine in ``nbytes`` (its value at 0 bytes is the call's latency)."""

    def allreduce_ms(self, nbytes: int, world_size: int) -> float: ...


@dataclass(frozen=True)
class AlphaBeta:
    """One flat ring: ``alpha_ms`` per step, ``beta_ms_per_byte`` per byte on a link."""

    alpha_ms: float
    beta_ms_per_byte: float

    def __post_init__(self):
        if (
            not (math.isfinite(self.alpha_ms) and math.isfinite(self.beta_ms_per_byte))
            or self.alpha_ms < 0
            or self.beta_ms_per_byte < 0
        ):
            raise ValueError(f"alpha and beta must be finite and >= 0, got {self.alpha_ms}, {self.beta_ms_per_byte}")

    def allreduce_ms(self, nbytes: int, world_size: int) -> float:
        if world_size < 1 or nbytes < 0:
            raise ValueError(f"need world_size >= 1 and nbytes >= 0, got {world_size}, {nbytes}")
        if world_size == 1:
            return 0.0
        steps = 2 * (world_size - 1)
        return steps * self.alpha_ms + steps / world_size * nbytes * self.beta_ms_per_byte

    @classmethod
    def from_bandwidth(cls, alpha_ms: float, gbit_per_s: float) -> "AlphaBeta":
        """From a link bandwidth in Gbit/s: 1 Gbit/s = 1.25e5 bytes/ms, so beta = 8e-6 / Gbit/s ms per byte."""
        if gbit_per_s <= 0:
            raise ValueError(f"bandwidth must be > 0 Gbit/s, got {gbit_per_s}")
        return cls(alpha_ms, 8e-6 / gbit_per_s)

    @property
    def busbw_gbit(self) -> float:
        """The link bandwidth in Gbit/s, which for a ring is NCCL's bus bandwidth of large calls."""
        return math.inf if self.beta_ms_per_byte == 0 else 8e-6 / self.beta_ms_per_byte


@dataclass(frozen=True)
class TwoTier:
    """A ring over ``gpus_per_host``-GPU hosts: every ring step moves n/p bytes over all edges at once, so a step
    costs its slowest edge; once the ring leaves one host (p > gpus_per_host) that is the worse of the two tiers'
    alpha and beta, otherwise the intra-host tier alone."""

    gpus_per_host: int
    intra: AlphaBeta
    inter: AlphaBeta

    def __post_init__(self):
        if self.gpus_per_host < 1:
            raise ValueError(f"gpus_per_host must be >= 1, got {self.gpus_per_host}")

    def tier(self, world_size: int) -> AlphaBeta:
        if world_size <= self.gpus_per_host:
            return self.intra
        return AlphaBeta(
            max(self.intra.alpha_ms, self.inter.alpha_ms), max(self.intra.beta_ms_per_byte, self.inter.beta_ms_per_byte)
        )

    def allreduce_ms(self, nbytes: int, world_size: int) -> float:
        return self.tier(world_size).allreduce_ms(nbytes, world_size)


@dataclass(frozen=True)
class Fit:
    """A fitted ring model and how well it reproduces the samples it was fitted on (errors in %)."""

    model: AlphaBeta
    r2: float
    median_abs_pct_error: float
    worst_abs_pct_error: float
    n: int


def _nnls2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with both coefficients >= 0: unconstrained if that is feasible, else the best one-term fit."""
    coef = np.linalg.lstsq(a, b, rcond=None)[0]
    if (coef >= 0).all():
        return coef
    best, best_sse = np.zeros(2), float(b @ b)
    for k in range(2):
        col = a[:, k]
        x = np.zeros(2)
        x[k] = max(0.0, float(col @ b) / float(col @ col)) if col @ col > 0 else 0.0
        sse = float(((a @ x - b) ** 2).sum())
        if sse < best_sse:
            best, best_sse = x, sse
    return best


def fit_ring(samples: Iterable[tuple[int, int, float]], *, relative: bool = True) -> Fit:
    """Fit alpha and beta (both >= 0) to (world_size, nbytes per call, ms per call) samples.

    ``relative`` (default) minimizes relative errors: calls span orders of magnitude in size, and an ordinary
    fit would let the largest calls decide alone, leaving the latency-bound small calls (alpha) unfitted.
    """
    rows = [(int(p), float(n), float(ms)) for p, n, ms in samples]
    sizes = sorted({n for _, n, _ in rows})
    if len(sizes) < 2:
        raise ValueError(
            f"fit_ring needs calls of at least 2 distinct sizes to separate alpha from beta, got sizes {sizes}"
        )
    if any(p < 2 for p, _, _ in rows) or any(not ms > 0 for _, _, ms in rows):
        raise ValueError("fit_ring needs world_size >= 2 and ms > 0 in every sample")
    p, n, y = (np.array(col, dtype=float) for col in zip(*rows))
    x = np.column_stack([2 * (p - 1), 2 * (p - 1) / p * n])
    w = 1 / y if relative else np.ones_like(y)
    coef = _nnls2(x * w[:, None], y * w)
    pred = x @ coef
    ss_res, ss_tot = float(((y - pred) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else float(ss_res == 0)
    err = np.abs(pred - y) / y * 100
    return Fit(AlphaBeta(float(coef[0]), float(coef[1])), r2, float(np.median(err)), float(err.max()), len(rows))


def fit_link(samples, alpha_ms: float | None = None) -> Fit:
    """The ring model as DDP's buckets see the link: beta from a plain least-squares fit, which the large calls
    (the buckets that carry most bytes) decide; alpha as given (the probe's stream of calls) or else from the
    calls of at most 1 MiB. A fit of relative errors let an emulated link's burst (small calls pass at loopback
    speed) make the per-byte cost ~25% low for DDP's 25-100 MiB buckets. Quality is of the returned model."""
    beta = fit_ring(samples, relative=False).model.beta_ms_per_byte
    p = samples[0][0]
    if alpha_ms is None:
        small = [n for _, n, _ in samples if n <= MIB] or [min(n for _, n, _ in samples)]
        alpha_ms = float(
            statistics.median(
                (ms - 2 * (p - 1) / p * n * beta) / (2 * (p - 1)) for _, n, ms in samples if n <= max(small)
            )
        )
    model = AlphaBeta(max(0.0, alpha_ms), beta)
    y = np.array([ms for _, _, ms in samples])
    pred = np.array([model.allreduce_ms(n, p) for p, n, _ in samples])
    err = np.abs(pred - y) / y * 100
    r2 = 1 - float(((y - pred) ** 2).sum()) / float(((y - y.mean()) ** 2).sum())
    return Fit(model, r2, float(np.median(err)), float(err.max()), len(samples))
