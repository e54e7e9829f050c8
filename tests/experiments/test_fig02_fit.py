"""Figure 2's ring alpha-beta fit recovers the model its calls were generated from."""

import pandas as pd
import pytest

from experiments.figures.fig02_allreduce_granularity import ring_fits
from simulator.model.comm import AlphaBeta


def test_ring_fit_recovers_alpha_and_bandwidth_from_call_medians():
    truth = AlphaBeta.from_bandwidth(0.05, 2.0)  # 50 us per step, 2 Gbit/s
    total = 2_500_000  # calls of 1M parameters: 1M, 1M and 0.5M, a mean of 2.5M / 3 (the cost is affine)
    rows = [
        dict(
            backend="gloo",
            world_size=n,
            total_params=total,
            params_per_call=k,
            num_calls=-(-total // k),
            total_bytes=4 * total,
            call_ms=truth.allreduce_ms(4 * total / -(-total // k), n) * f,
        )
        for n in (2, 4)
        for k in (10_000, 100_000, 1_000_000)
        for f in (0.99, 1.0, 1.01)
    ]  # median: f = 1
    rows.append(
        dict(
            backend="gloo",
            world_size=1,
            total_params=total,
            params_per_call=10_000,
            num_calls=250,
            total_bytes=4 * total,
            call_ms=0.01,
        )
    )  # one rank: no ring
    fit = ring_fits(pd.DataFrame(rows))["gloo"]
    assert fit.model.alpha_ms == pytest.approx(0.05, rel=1e-6)
    assert fit.model.busbw_gbit == pytest.approx(2.0, rel=1e-6)
    assert fit.n == 6 and fit.r2 == pytest.approx(1.0)
    assert ring_fits(pd.DataFrame(rows[:3])) == {}  # one call size cannot separate alpha from beta
