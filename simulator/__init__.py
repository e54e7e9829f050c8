"""Predict DDP iterations where we cannot measure them (more ranks, other networks, faster devices) from a
calibration: compute-only gradient-ready times, an allreduce cost model and DDP's own costs, replayed on ddp_impl's
bucket assignment by a small event simulation of one iteration. Two parts: ``model`` is the prediction itself (cost
models, the simulation, the calibration file, a scenario's prediction, the recommended bucket cap, the named
clusters' stated numbers) and imports torch, numpy and ``ddp_impl``, nothing of the harness; ``probe`` calibrates
this machine by running the probe on a point's ranks through the harness (and counts FLOPs of the harness's models),
importing ``harness`` and ``model``. This package re-exports only harness-free names, so importing it, or anything
under ``model``, never imports the harness (tests/test_layout.py checks both).
"""

from .model.comm import AlphaBeta, CommModel, Fit, TwoTier, fit_ring
from .model.iteration import ComputeProfile, Prediction, buckets_for, simulate

__all__ = [
    "AlphaBeta",
    "CommModel",
    "Fit",
    "TwoTier",
    "fit_ring",
    "ComputeProfile",
    "Prediction",
    "buckets_for",
    "simulate",
]
