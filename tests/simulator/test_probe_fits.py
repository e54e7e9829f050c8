"""What the probe derives from its measurements before ``predict`` uses them: DDP's host cost per gradient and
per bucket (and the stand-in model that times it), the link's alpha and beta, the contention between compute and
communication, and each iteration's compute from its slowest rank."""

import statistics

import pytest

from simulator import AlphaBeta, fit_ring


def test_host_cost_solves_per_gradient_and_per_bucket_from_three_backwards():
    from simulator.model.host_cost import solve

    # 10 gradients, g = 0.02, b = 0.3, copies 0.1: one bucket 5 + 0.2 + 0.3 + 0.1; one per gradient 5 + 0.2 + 3 + 0.1
    cost = solve((5.0, 5.6, 8.3), gradients=10, copy_ms=0.1)
    assert (cost.per_gradient_ms, cost.per_bucket_ms) == (pytest.approx(0.02), pytest.approx(0.3))
    noisy = solve((5.0, 4.9, 4.8), gradients=10, copy_ms=0.1)
    assert (noisy.per_gradient_ms, noisy.per_bucket_ms) == (0.0, 0.0)  # noise never makes work negative
    # 100 gradients in 1 bucket (5 + 2 + 0.3 + 0.1) and in 10 (5 + 2 + 3 + 0.1)
    layouts = solve((5.0, 7.4, 10.1), gradients=100, copy_ms=0.1, buckets=(1, 10))
    assert (layouts.per_gradient_ms, layouts.per_bucket_ms) == (pytest.approx(0.02), pytest.approx(0.3))
    # one parameter (per dtype): both layouts are the same buckets, so nothing to price a bucket by
    assert solve((5.0, 5.2, 5.3), gradients=1, copy_ms=0.0, buckets=(1, 1)).per_bucket_ms == 0.0


def test_host_cost_prices_buckets_of_several_gradients_as_ddp_lays_them_out():
    import torch

    from simulator.probe.stand_in import GRADIENTS_PER_BUCKET, MIN_BUCKETS, layouts

    # 2000 gradients of 16 or 256 floats: one bucket, then buckets of about 10 gradients' bytes
    weights = [torch.zeros(16 if i % 2 else 256) for i in range(2000)]
    (one_mb, one), (several_mb, several) = layouts(weights)
    assert one == 1 and one_mb * 2**20 >= 4 * (1000 * 16 + 1000 * 256)
    assert 0.9 * 2000 / GRADIENTS_PER_BUCKET <= several <= 1.1 * 2000 / GRADIENTS_PER_BUCKET
    assert layouts(weights + [torch.zeros(3, dtype=torch.float64)])[0][1] == 2  # a bucket per dtype
    # fewer gradients: still enough buckets to stand above the noise, even where large ones fill a bucket each
    assert MIN_BUCKETS <= layouts(weights[:300])[1][1] < 300
    mixed = [torch.zeros(2**16)] * 50 + [torch.zeros(64)] * 150
    assert MIN_BUCKETS <= layouts(mixed)[1][1] < 200
    # too few gradients for that: one bucket per gradient
    assert layouts(weights[:8])[1] == (0.0, 8)
    assert layouts(weights[:1]) == [(2 * 1024 / 2**20, 1), (0.0, 1)]  # one parameter: the same one bucket twice


def test_host_cost_takes_each_rounds_slowest_rank():
    from simulator.probe.stand_in import slowest

    # 3 rounds of (no DDP, one bucket, one per gradient); the ranks take turns being slow
    rank0 = [[5.0, 6.0, 5.0], [5.6, 6.6, 5.6], [8.3, 9.3, 8.3]]
    rank1 = [[6.0, 5.0, 7.0], [6.6, 5.6, 7.6], [9.3, 8.3, 10.3]]
    cost = slowest([dict(backward_ms=times, gradients=10, copy_ms=0.1) for times in (rank0, rank1)])
    assert cost.backward_ms == (6.0, 6.6, 9.3)  # medians of (6, 6, 7), (6.6, 6.6, 7.6), (9.3, 9.3, 10.3)
    assert (cost.per_gradient_ms, cost.per_bucket_ms) == (pytest.approx(0.02), pytest.approx(0.3))


def test_host_cost_stand_in_takes_the_models_parameters_without_its_compute():
    import torch

    from simulator.probe.stand_in import STAND_IN_MAX_NUMEL, StandIn

    params = [torch.zeros(3, 4), torch.zeros(STAND_IN_MAX_NUMEL + 5, dtype=torch.float64), torch.zeros(7)]
    stand_in = StandIn(params, "cpu")
    weights = list(stand_in.parameters())
    # as many, as large (up to the cap: beyond it DDP copies by the gradient's own hook), of the same dtypes
    assert [w.numel() for w in weights] == [12, STAND_IN_MAX_NUMEL, 7]
    assert [w.dtype for w in weights] == [torch.float32, torch.float64, torch.float32]
    order = []
    for i, w in enumerate(weights):
        w.register_hook(lambda g, i=i: order.append(i))
    stand_in(torch.ones(())).backward()
    assert order == [2, 1, 0] and all(torch.equal(w.grad, torch.ones_like(w)) for w in weights)


def test_link_fit_takes_the_rate_from_large_calls_despite_a_burst():
    from ddp_impl.options import MIB
    from simulator.model.comm import fit_link

    link = AlphaBeta(0.3, 1.6e-5)  # 500 Mbit/s
    sizes = (4096, 65536, MIB, 8 * MIB, 32 * MIB, 128 * MIB)
    exact = fit_link([(2, n, link.allreduce_ms(n, 2)) for n in sizes for _ in range(2)])
    assert exact.model.alpha_ms == pytest.approx(0.3, rel=1e-6) and exact.model.beta_ms_per_byte == pytest.approx(
        1.6e-5, rel=1e-6
    )
    # a burst: calls up to 1 MiB pass at 5x the rate (as tbf lets a burst through); the large calls set beta
    burst = [(2, n, link.allreduce_ms(n, 2) if n > MIB else 0.6 + n * 1.6e-5 / 5) for n in sizes for _ in range(2)]
    fit = fit_link(burst)
    assert fit.model.beta_ms_per_byte == pytest.approx(1.6e-5, rel=0.02)
    assert fit_ring(burst).model.beta_ms_per_byte < 0.9 * 1.6e-5  # what a relative fit made of it


def test_contention_is_the_slowest_ranks_per_pair():
    from simulator.probe.calibrate import slowest_rank_contention

    # two ranks, three (alone, under) pairs: the rank that slows most changes between pairs, as on shared cores
    rank0 = [(100.0, 170.0), (100.0, 124.0), (110.0, 176.0)]
    rank1 = [(105.0, 126.0), (100.0, 171.0), (100.0, 120.0)]
    # per pair: 170/105, 171/100, 176/110 -> 0.619, 0.71, 0.6; the ranks' own medians would have read ~0.4
    assert slowest_rank_contention([rank0, rank1]) == pytest.approx(170 / 105 - 1)
    assert slowest_rank_contention([[(100.0, 90.0)]]) == 0.0  # faster under communication: no contention
    assert slowest_rank_contention([[], []]) == 0.0  # one rank: no pairs


def test_compute_is_the_slowest_rank_in_each_iteration():
    from simulator.probe.calibrate import slowest_compute

    def it(forward, backward, ready, optimizer=1.0):
        return dict(forward=forward, backward=backward, ready=ready, optimizer=optimizer)

    # the slower rank changes between iterations: each one's is what a synchronized iteration waits for
    rank0 = [it(10.0, 20.0, [5.0, 20.0]), it(14.0, 20.0, [5.0, 20.0], 3.0), it(10.0, 20.0, [5.0, 20.0])]
    rank1 = [it(14.0, 24.0, [4.0, 24.0], 3.0), it(10.0, 20.0, [5.0, 20.0]), it(10.0, 30.0, [5.0, 30.0])]
    got = slowest_compute([dict(runs=rank0), dict(runs=rank1)])
    # per iteration: forward 14, 14, 10; forward + backward 38, 34, 40 -> backward 24, 20, 30; optimizer 3, 3, 1
    assert (got["forward_ms"], got["backward_ms"], got["optimizer_ms"]) == (14.0, 24.0, 3.0)
    # each gradient's ready time counted from the iterations' common start: max(10 + 5, 14 + 4) - 14 = 4, then 5, 5
    assert got["ready_ms"] == (5.0, 24.0)
    # the slower rank's medians would have read 10 + 24 + 1 = 35 ms where the iterations' median is 40
    assert max(statistics.median(r["forward"] for r in runs) for runs in (rank0, rank1)) == 10.0
