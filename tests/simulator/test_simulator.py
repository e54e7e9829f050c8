"""The simulator's math against answers worked out by hand (in the comments)."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from ddp_impl.buckets import MIB, ParamSpec, assign_buckets
from simulator import AlphaBeta, ComputeProfile, TwoTier, buckets_for, fit_ring, simulate
from simulator.probe.call_fit import fit_calls, latency_from_calls, latency_share_from_calls

# p = 2: a call costs 2(p-1)*alpha + 2(p-1)/p * n * beta = 2*0.5 + 1 * 400 * 0.01 = 1 ms latency + 4 ms of bytes
COMM = AlphaBeta(alpha_ms=0.5, beta_ms_per_byte=0.01)
# two 400-byte parameters; backward makes p1's gradient at 4 ms, p0's at 10 ms (= backward end)
TWO = ComputeProfile(param_bytes=(400, 400), ready_ms=(10.0, 4.0), backward_ms=10.0, forward_ms=5.0, optimizer_ms=2.0)


def test_ring_cost_formula():
    ab = AlphaBeta(0.1, 1e-6)
    # 2*3*0.1 + 2*3/4 * 1e6 * 1e-6 = 0.6 + 1.5
    assert ab.allreduce_ms(1_000_000, 4) == pytest.approx(2.1)
    # 2*1*0.1 + 2*1/2 * 5e5 * 1e-6 = 0.2 + 0.5
    assert ab.allreduce_ms(500_000, 2) == pytest.approx(0.7)
    assert ab.allreduce_ms(1_000_000, 1) == 0.0
    # 8 Gbit/s = 1e9 bytes/s = 1e6 bytes/ms -> beta 1e-6 ms/byte, and back
    fb = AlphaBeta.from_bandwidth(0.2, 8.0)
    assert fb.beta_ms_per_byte == pytest.approx(1e-6)
    assert fb.busbw_gbit == pytest.approx(8.0)
    assert AlphaBeta(0.0, 2e-6).busbw_gbit == pytest.approx(4.0)


def _synthetic(alpha, beta, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in (2, 4, 8):
        for n in (2**k for k in range(10, 27)):  # 1 KiB .. 64 MiB
            for _ in range(3):
                ms = AlphaBeta(alpha, beta).allreduce_ms(n, p) * float(np.exp(rng.normal(0.0, noise)))
                out.append((p, n, ms))
    return out


def test_fit_recovers_exact_alpha_beta():
    fit = fit_ring(_synthetic(0.05, 2e-7))
    assert fit.model.alpha_ms == pytest.approx(0.05, rel=0.01)
    assert fit.model.beta_ms_per_byte == pytest.approx(2e-7, rel=0.01)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.worst_abs_pct_error < 1e-6
    assert fit.n == 3 * 17 * 3


def test_fit_with_noise_stays_close():
    fit = fit_ring(_synthetic(0.05, 2e-7, noise=0.05, seed=1))  # ~5 % multiplicative noise per call
    assert fit.model.alpha_ms == pytest.approx(0.05, rel=0.05)
    assert fit.model.beta_ms_per_byte == pytest.approx(2e-7, rel=0.05)
    assert fit.r2 > 0.99
    assert 1.0 < fit.median_abs_pct_error < 8.0
    assert fit.worst_abs_pct_error >= fit.median_abs_pct_error


def test_fit_clips_negative_alpha_to_zero():
    # exact ring timings with alpha = -0.01 (unphysical): ms = 2(p-1)/p * n * 1e-6 - 0.02 * (p-1)
    # p=2: n=1e5 -> 0.1 - 0.02 = 0.08, n=1e6 -> 0.98; p=4: n=1e5 -> 0.15 - 0.06 = 0.09, n=1e6 -> 1.44
    samples = [(p, n, AlphaBeta(0, 1e-6).allreduce_ms(n, p) - 0.02 * (p - 1)) for p in (2, 4) for n in (1e5, 1e6)]
    fit = fit_ring(samples)
    assert fit.model.alpha_ms == 0.0
    # beta alone, relative errors: minimize sum (beta * x_i / y_i - 1)^2 -> beta = sum r_i / sum r_i^2 with
    # r_i = x_i / y_i = (1/0.8, 1/0.98, 1/0.6, 1/0.96) * 1e6: 4.97884 / 6.46664 * 1e-6 = 0.76993e-6
    assert fit.model.beta_ms_per_byte == pytest.approx(0.76993e-6, rel=1e-4)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="2 distinct sizes"):
        fit_ring([(2, 1000, 1.0), (4, 1000, 1.5), (8, 1000, 2.0)])


def test_overlap_on_vs_off():
    buckets = buckets_for(TWO, 0)  # cap 0: one bucket per gradient, p1 (ready first) in bucket 0
    assert [b.param_indices for b in buckets] == [(1,), (0,)]
    on = simulate(TWO, buckets, COMM, 2)
    # b0: ready 4, runs 4..9; b1: ready 10, runs 10..15 -> backward 15, iteration 5 + 15 + 2 = 22
    assert on.ready_ms == (4.0, 10.0)
    assert on.launch_ms == (4.0, 10.0)
    assert on.done_ms == pytest.approx((9.0, 15.0))
    assert on.backward_ms == pytest.approx(15.0)
    assert on.total_ms == pytest.approx(22.0)
    assert on.comm_ms == pytest.approx(11.0)  # first launch 4 .. last done 15
    assert on.exposed_comm_ms == pytest.approx(5.0)  # 22 - 5 - 10 - 2
    off = simulate(TWO, buckets, COMM, 2, overlap=False)
    # both launch at 10, one channel: 10..15, 15..20 -> 5 + 20 + 2 = 27
    assert off.launch_ms == (10.0, 10.0)
    assert off.done_ms == pytest.approx((15.0, 20.0))
    assert off.total_ms == pytest.approx(27.0)
    assert off.exposed_comm_ms == pytest.approx(10.0)
    assert on.as_dict()["done_ms"] == pytest.approx([9.0, 15.0])


def test_cap_zero_vs_one_big_bucket():
    one = buckets_for(TWO, 100)  # 100 MB cap: one 800-byte bucket
    assert [b.param_indices for b in one] == [(1, 0)] and one[0].nbytes == 800
    pred = simulate(TWO, one, COMM, 2)
    # ready at 10, costs 1 + 800 * 0.01 = 9 -> done 19, iteration 5 + 19 + 2 = 26 (vs 22 with cap 0)
    assert pred.done_ms == pytest.approx((19.0,))
    assert pred.total_ms == pytest.approx(26.0)
    assert simulate(TWO, buckets_for(TWO, 0), COMM, 2).total_ms == pytest.approx(22.0)


def test_round_robin_groups_share_bandwidth():
    prof = ComputeProfile((400, 400), ready_ms=(2.0, 0.0), backward_ms=2.0, forward_ms=5.0, optimizer_ms=2.0)
    buckets = buckets_for(prof, 0)  # b0 = p1 ready 0, b1 = p0 ready 2
    one = simulate(prof, buckets, COMM, 2)
    # one channel: b0 0..5, b1 waits, 5..10 -> 5 + 10 + 2 = 17
    assert one.start_ms == pytest.approx((0.0, 5.0))
    assert one.done_ms == pytest.approx((5.0, 10.0))
    assert one.total_ms == pytest.approx(17.0)
    two = simulate(prof, buckets, COMM, 2, groups=2)
    # b0: latency 0..1, bytes alone 1..3 (2 of 4 ms done); b1: latency 2..3. From 3 both move bytes at half
    # rate: b0's last 2 ms take 4 -> done 7; b1 has then 2 ms left, alone -> done 9. 5 + 9 + 2 = 16
    assert two.start_ms == pytest.approx((0.0, 2.0))
    assert two.done_ms == pytest.approx((7.0, 9.0))
    assert two.total_ms == pytest.approx(16.0)
    assert two.comm_ms == pytest.approx(9.0)  # launched at 0 and 2, done at 7 and 9: the span, not 7 + 7


def test_concurrent_calls_in_one_group_hide_latency_not_bytes():
    prof = ComputeProfile((400, 400), ready_ms=(0.0, 0.0), backward_ms=0.0, forward_ms=5.0, optimizer_ms=2.0)
    buckets = buckets_for(prof, 0)  # both ready at 0: each call 1 ms latency + 4 ms of bytes
    # one at a time: 0..1 latency, 1..5 bytes; then 5..6, 6..10
    assert simulate(prof, buckets, COMM, 2).done_ms == pytest.approx((5.0, 10.0))
    # two at a time (Gloo's two worker threads): both wait 0..1, then share the link: 8 ms of bytes -> both at 9
    two = simulate(prof, buckets, COMM, 2, concurrent=2)
    assert two.start_ms == pytest.approx((0.0, 0.0))
    assert two.done_ms == pytest.approx((9.0, 9.0))
    assert two.comm_ms == pytest.approx(9.0)  # two calls 0..9 at once: 9 ms, not 18
    # as many groups with one call each: the same
    assert simulate(prof, buckets, COMM, 2, groups=2).done_ms == pytest.approx((9.0, 9.0))
    with pytest.raises(ValueError, match="concurrent"):
        simulate(prof, buckets, COMM, 2, concurrent=0)


def test_latency_from_calls_inverts_the_simulator():
    # gradients ready at 0, 10, 20 ms; one call per gradient, 2 steps each (p = 2): the calls never queue, so the
    # last is done at 20 + 2 * alpha: done at 23 -> alpha 1.5, whether one or two calls may run at once
    spread = ComputeProfile((4, 4, 4), ready_ms=(20.0, 10.0, 0.0), backward_ms=20.0, forward_ms=0.0, optimizer_ms=0.0)
    assert latency_from_calls(spread, 23.0, 2) == pytest.approx(1.5, rel=2e-3)
    assert latency_from_calls(spread, 23.0, 2, concurrent=2) == pytest.approx(1.5, rel=2e-3)
    # four gradients ready at once: one at a time the last is done at 4 * 2 * alpha, two at a time at 2 * 2 * alpha
    burst = ComputeProfile((4,) * 4, ready_ms=(0.0,) * 4, backward_ms=0.0, forward_ms=0.0, optimizer_ms=0.0)
    assert latency_from_calls(burst, 12.0, 2) == pytest.approx(1.5, rel=2e-3)
    assert latency_from_calls(burst, 12.0, 2, concurrent=2) == pytest.approx(3.0, rel=2e-3)
    # with bytes: two 400-byte gradients ready at 0, 4 ms of bytes each (beta 0.01), one call at a time: the
    # last is done at 2a + 4 + 2a + 4; done at 12 -> a = 1
    two = ComputeProfile((400, 400), ready_ms=(0.0, 0.0), backward_ms=0.0, forward_ms=0.0, optimizer_ms=0.0)
    assert latency_from_calls(two, 12.0, 2, beta_ms_per_byte=0.01) == pytest.approx(1.0, rel=2e-3)
    # done before a call could have run at all (or its bytes moved), or one rank: no latency
    assert latency_from_calls(spread, 19.0, 2) == 0.0
    assert latency_from_calls(two, 7.0, 2, beta_ms_per_byte=0.01) == 0.0
    assert latency_from_calls(spread, 23.0, 1) == 0.0


def test_calls_waiting_out_their_latency_slow_compute_by_the_latency_share():
    # contention 1: compute at half speed beside calls moving bytes; here the calls only wait out 2 * 1.5 ms each.
    # Share 0.5: compute at rate 1/1.5 while one runs. Gradient 2 ready at 0: its call 0-3 ms, compute reaches 2;
    # gradient 1 at 10 (t = 11): call 11-14, compute 10 -> 12; backward's compute ends at 20 + 2 = 22 ms, and the
    # last call (gradient 0, ready then) ends at 25. Share 1 (rate 1/2): 1.5 lost per call -> 23; share 0 -> 20.
    spread = ComputeProfile(
        (4, 4, 4), ready_ms=(20.0, 10.0, 0.0), backward_ms=20.0, forward_ms=0.0, optimizer_ms=0.0, contention=1.0
    )
    latency = AlphaBeta(1.5, 0.0)
    ends = [
        simulate(replace(spread, latency_contention=s), buckets_for(spread, 0.0), latency, 2) for s in (0.0, 0.5, 1.0)
    ]
    assert [p.compute_end_ms for p in ends] == [pytest.approx(20.0), pytest.approx(22.0), pytest.approx(23.0)]
    assert ends[1].backward_ms == pytest.approx(25.0)
    assert latency_share_from_calls(spread, 22.0, 2, latency) == pytest.approx(0.5, abs=2e-3)
    assert latency_share_from_calls(spread, 30.0, 2, latency) == 1.0  # at most all of it
    assert latency_share_from_calls(spread, 19.0, 2, latency) == 0.0
    assert latency_share_from_calls(replace(spread, contention=0.0), 22.0, 2, latency) == 0.0  # nothing contends
    # both from the calls' end and the compute's: alpha 1.5 and share 0.5 back
    assert fit_calls(spread, 25.0, 22.0, 2) == (pytest.approx(1.5, rel=5e-3), pytest.approx(0.5, abs=5e-3))
    with pytest.raises(ValueError, match="a share"):
        replace(spread, latency_contention=1.5)


def test_contention_slows_compute():
    prof = ComputeProfile((400, 400), (10.0, 4.0), 10.0, 5.0, 2.0, contention=1.0)
    pred = simulate(prof, buckets_for(prof, 0), COMM, 2)
    # b0 ready 4: latency 4..5 (costs no CPU: compute at full rate, 5 of 10 by 5), bytes 5..9 with compute at
    # half rate (7 of 10 by 9), the rest 3 at full rate -> compute ends 12 (b1 ready); b1 latency 12..13, bytes
    # 13..17; 5 + 17 + 2 = 24; exposed 24 - 5 - 10 - 2 = 7
    assert pred.ready_ms == pytest.approx((4.0, 12.0))
    assert pred.done_ms == pytest.approx((9.0, 17.0))
    assert pred.backward_ms == pytest.approx(17.0)
    assert pred.total_ms == pytest.approx(24.0)
    assert pred.exposed_comm_ms == pytest.approx(7.0)


def test_sync_every_averages_local_and_synced():
    prof = ComputeProfile((400, 400), (10.0, 4.0), 10.0, 5.0, 2.0, other_ms=1.0)
    pred = simulate(prof, buckets_for(prof, 0), COMM, 2, sync_every=4)
    # synced 5 + 15 + 2 + 1 = 23, local 5 + 10 + 1 = 16, mean (23 + 3 * 16) / 4 = 17.75
    assert pred.synced_ms == pytest.approx(23.0)
    assert pred.local_ms == pytest.approx(16.0)
    assert pred.total_ms == pytest.approx(17.75)


def test_scaled_profile():
    fast = TWO.scaled(0.5)
    assert fast.ready_ms == (5.0, 2.0) and fast.backward_ms == 5.0 and fast.forward_ms == 2.5
    assert fast.optimizer_ms == 1.0 and fast.param_bytes == TWO.param_bytes


def test_buckets_for_is_ddp_impl_on_ready_order():
    # ready (1, 5, 1, 0): p3 first, then the tie p0/p2 last-registered first (p2, p0), then p1
    prof = ComputeProfile((MIB, 2 * MIB, MIB, MIB), (1.0, 5.0, 1.0, 0.0), 5.0, 1.0, 1.0)
    specs = [ParamSpec(f"p{i}", b // 4, torch.float32, torch.device("cpu")) for i, b in enumerate(prof.param_bytes)]
    # cap 2 MiB: p3+p2 = 2 MiB closes, p0+p1 = 3 MiB closes
    got = buckets_for(prof, 2)
    assert [b.param_indices for b in got] == [(3, 2), (0, 1)]
    assert got == assign_buckets(specs, 2 * MIB, order=[3, 2, 0, 1])
    # first cap 1 MiB: p3 alone, then p2+p0 = 2 MiB, then p1
    got = buckets_for(prof, 2, first_cap_mb=1)
    assert [b.param_indices for b in got] == [(3,), (2, 0), (1,)]
    assert got == assign_buckets(specs, 2 * MIB, 1 * MIB, order=[3, 2, 0, 1])


def test_two_tier_inter_host_only_beyond_one_host():
    tt = TwoTier(8, intra=AlphaBeta(0.01, 1e-7), inter=AlphaBeta(0.05, 1e-6))
    # p = 8, intra: 2*7*0.01 + 2*7/8 * 8e6 * 1e-7 = 0.14 + 1.4
    assert tt.allreduce_ms(8_000_000, 8) == pytest.approx(1.54)
    # p = 16, inter: 2*15*0.05 + 2*15/16 * 8e6 * 1e-6 = 1.5 + 15
    assert tt.allreduce_ms(8_000_000, 16) == pytest.approx(16.5)
    mixed = TwoTier(8, intra=AlphaBeta(0.01, 1e-7), inter=AlphaBeta(0.001, 1e-6))
    # slowest edge per term: alpha 0.01 (intra), beta 1e-6 (inter): 30 * 0.01 + 15 = 15.3
    assert mixed.allreduce_ms(8_000_000, 16) == pytest.approx(15.3)
    assert tt.allreduce_ms(8_000_000, 1) == 0.0


def test_bad_profiles_rejected():
    with pytest.raises(ValueError, match="ready after backward"):
        ComputeProfile((4,), (3.0,), 2.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="sizes"):
        ComputeProfile((4, 4), (1.0,), 2.0, 1.0, 1.0)


def test_comm_contention_slows_the_bytes_while_backward_computes():
    # bucket 0 (p1) ready at 4: latency 4 -> 5, then 4 ms of bytes at half speed until compute ends at 10
    # (2.5 done), the last 1.5 at full speed: done 11.5. Bucket 1 (p0) ready at 10 waits for the channel:
    # 11.5 -> 12.5 latency -> 16.5 bytes. Synced: 5 + 16.5 + 2 = 23.5 (22 without comm_contention).
    slow = ComputeProfile(
        param_bytes=(400, 400),
        ready_ms=(10.0, 4.0),
        backward_ms=10.0,
        forward_ms=5.0,
        optimizer_ms=2.0,
        comm_contention=1.0,
    )
    pred = simulate(slow, buckets_for(slow, 0), COMM, 2)
    assert pred.done_ms == pytest.approx((11.5, 16.5)) and pred.total_ms == pytest.approx(23.5)
