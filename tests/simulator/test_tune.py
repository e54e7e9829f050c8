"""The bucket-cap recommendation: minimax regret over the probe's uncertain inputs, computed by hand."""

import pytest

from simulator import AlphaBeta, ComputeProfile, TwoTier
from simulator.model.calibration import VERSION, Calibration
from simulator.model.recommend import recommend, with_alpha_scaled

# 400-byte gradients ready at 4 ms (p1) and 10 ms (p0), nothing else: no copies, forward, optimizer or contention.
# One call at a time (NCCL). At beta 0.01 a 400-byte bucket's bytes take 4 ms, 800 bytes 8 ms, after 2a latency:
#   cap 0 (a bucket each): p1's call 4 -> 8 + 2a; p0's starts at max(10, 8 + 2a) and takes 2a + 4, so for
#   a > 1 the iteration is 12 + 4a;
#   cap 1000 (one bucket): 10 + 2a + 8 = 18 + 2a.
PROFILE = ComputeProfile(
    param_bytes=(400, 400), ready_ms=(10.0, 4.0), backward_ms=10.0, forward_ms=0.0, optimizer_ms=0.0
)


def _calibration(alpha):
    return Calibration(
        profile=PROFILE,
        comm=AlphaBeta(alpha, 0.01),
        copy_ms_per_byte=0.0,
        buffer_bytes=0,
        point=dict(model="small", profile="cpu", world_size=2, backend="nccl"),
        fit={},
        meta=dict(version=VERSION),
    )


def test_a_near_tie_goes_to_the_cap_that_stays_close_to_the_best():
    # a = 2.9: cap 0 23.6 ms, cap 1000 23.8 ms: cap 0 is the nominal minimum. Latency halved (1.45): 17.8 vs 20.9;
    # doubled (5.8): 35.2 vs 29.6. Worst regret: cap 0 35.2 / 29.6 = 1.189, cap 1000 20.9 / 17.8 = 1.174.
    rec = recommend(_calibration(2.9), (0, 1000))
    assert rec.predicted_ms == pytest.approx({0: 23.6, 1000: 23.8})
    assert rec.regret == pytest.approx({0: 35.2 / 29.6, 1000: 20.9 / 17.8})
    assert rec.band_ms[0] == pytest.approx((17.8, 35.2)) and rec.band_ms[1000] == pytest.approx((20.9, 29.6))
    assert rec.cap_mb == 1000


def test_a_clear_minimum_is_kept():
    # a = 1.5: cap 0 18 ms, cap 1000 21 ms; halved (0.75: p0's call starts at 10): 15.5 vs 19.5; doubled (3):
    # 24 vs 24. Cap 0 is never worse.
    rec = recommend(_calibration(1.5), (1000, 0))
    assert rec.predicted_ms == pytest.approx({0: 18.0, 1000: 21.0})
    assert rec.regret[0] == pytest.approx(1.0) and rec.cap_mb == 0


def test_latency_scales_on_every_tier_and_an_empty_grid_is_refused():
    two = with_alpha_scaled(TwoTier(8, AlphaBeta(0.01, 1e-8), AlphaBeta(0.02, 1e-7)), 2.0)
    assert (two.intra.alpha_ms, two.inter.alpha_ms, two.inter.beta_ms_per_byte) == pytest.approx((0.02, 0.04, 1e-7))
    with pytest.raises(ValueError, match="at least one bucket cap"):
        recommend(_calibration(1.0), ())
