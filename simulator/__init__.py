"""Predict DDP iterations where we cannot measure them (more ranks, other networks, faster devices) from a
profile calibrated where we can: compute-only gradient-ready times, an allreduce cost model fitted to measured
calls, and ddp_impl's own bucket assignment, combined by a small event simulation of one iteration.

The core is pure math on torch, numpy and ``ddp_impl``: ``comm`` holds the cost models and the fit,
``iteration`` the profile, the bucketing and the simulation. ``calibrate`` probes this machine through the
harness (imported on use, it starts ranks); ``predict`` adds what DDP itself costs and answers for one point;
``clusters`` builds the same calibration for a named GPU cluster from stated numbers instead of a probe; ``tune``
picks the bucket cap to recommend.
"""
from .comm import AlphaBeta, CommModel, Fit, TwoTier, fit_ring
from .iteration import ComputeProfile, Prediction, buckets_for, simulate

__all__ = ["AlphaBeta", "CommModel", "Fit", "TwoTier", "fit_ring", "ComputeProfile", "Prediction", "buckets_for",
           "simulate"]
