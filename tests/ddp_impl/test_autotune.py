"""``bucket_cap_mb="auto"``: the search on synthetic latencies (no processes), what it refuses, and ours tuning
beside torch's DDP on spawned Gloo ranks with gradients equal at every iteration."""

import math
import random

import pytest
import torch

from ddp_impl import DistributedDataParallel
from ddp_impl.cap_search import BUDGET_ITERS, DEFAULT_BUCKET_CAP_MB, MIB, AutoTuner, distinct_caps, ratio_interval
from harness.launch.spawn import launch
from tests.ddp_impl import autotune_cases

BIG = 200 * MIB  # gradient bytes of a model larger than every candidate cap


def search(curve, noise=0.02, prior=None, seed=0, model_bytes=BIG):
    """Run the search against ``curve(cap_mb) -> ms`` with multiplicative noise; (result, log)."""
    rng = random.Random(seed)
    tuner, now, cap = AutoTuner(model_bytes, lambda ms: ms, prior), 0.0, float(DEFAULT_BUCKET_CAP_MB)
    while True:
        asked = tuner.on_forward(now)
        cap = cap if asked is None else asked
        if tuner.result is not None:
            return tuner.result, tuner.log
        tuner.trial_started(now)
        now += curve(cap) * (1 + rng.gauss(0, noise))


def valley(best_mb):
    return lambda cap: 100 * (1 + 0.1 * abs(math.log(max(cap, 0.1) / best_mb)))


@pytest.mark.parametrize("seed", range(4))
def test_a_cap_resolved_faster_than_the_default_is_chosen_within_the_budget(seed):
    result, log = search(valley(3.0), seed=seed)
    assert result["cap_mb"] != DEFAULT_BUCKET_CAP_MB and 1 <= result["cap_mb"] <= 10
    assert "resolved faster" in result["reason"]
    assert result["iterations"] <= BUDGET_ITERS and max(t["iteration"] for t in log) < result["iterations"]
    assert {t["stage"] for t in log} == {"coarse", "fine"}


def test_a_few_percent_over_the_default_is_found_through_the_noise_of_single_iterations():
    """ResNet50 at 1 Gbit/s on this CPU (make autotune's fixed caps): 5 MiB ~5% faster than 25 MiB, 1 MiB between;
    one iteration's time varies by ~2%. Three rounds cannot resolve that; the rounds after them go to the close caps."""
    curve = {1.0: 103.0, 5.0: 100.0, 25.0: 105.6, 100.0: 115.0}
    results = [search(lambda cap: curve.get(cap, 101.0), seed=seed)[0] for seed in range(20)]
    assert sum(r["cap_mb"] != DEFAULT_BUCKET_CAP_MB for r in results) >= 18
    assert all(r["iterations"] <= BUDGET_ITERS for r in results)


def test_without_a_real_difference_the_cap_mostly_stays_at_the_default():
    """Every cap equally fast: a cap other than the default is chosen only by a rare chance resolution (about 5% of
    searches; harmless, as every cap is as fast)."""
    results = [search(lambda cap: 100.0, noise=0.03, seed=seed)[0] for seed in range(60)]
    assert sum(r["cap_mb"] != DEFAULT_BUCKET_CAP_MB for r in results) <= 6
    assert all(r["iterations"] <= BUDGET_ITERS for r in results)


def test_a_prior_narrows_the_search_to_its_best_caps_and_the_default():
    result, log = search(valley(8.0), prior=[8.0, 16.0, 1.0])
    assert {t["cap_mb"] for t in log} == {8.0, 16.0, 25.0}
    assert result["cap_mb"] == 8.0
    coarse, _ = search(valley(8.0))
    assert result["iterations"] < coarse["iterations"]


def test_a_model_smaller_than_every_cap_has_nothing_to_tune():
    result, log = search(valley(3.0), model_bytes=MIB // 2)
    assert (result["cap_mb"], log, result["iterations"]) == (DEFAULT_BUCKET_CAP_MB, [], 3)
    assert distinct_caps([1, 5, 25, 100], 20 * MIB) == [1, 5, 25, 100]  # 25: a 1 MiB bucket first, 100: one
    assert distinct_caps([1, 25, 100], MIB // 2) == [25]  # all one bucket: the default kept
    assert distinct_caps([0, 40, 100], 30 * MIB) == [0, 40]


def test_the_paired_interval_is_the_same_on_every_rank_and_brackets_the_ratio():
    a, b = [110.0, 121.0, 99.0, 105.0], [100.0, 110.0, 90.0, 95.0]
    lo, hi = ratio_interval(a, b)
    assert (lo, hi) == ratio_interval(a, b) and lo <= 107.5 / 97.5 <= hi and lo > 1
    assert torch.get_rng_state().equal(torch.get_rng_state())  # its own generator: the user's stream untouched


def test_what_cannot_tune_is_refused_at_construction():
    net = torch.nn.Linear(2, 2)
    for kwargs in (dict(first_bucket_cap_mb=1), dict(bucket_cap_mb_list=[1, 2]), dict(comm_hook=lambda s, b: None)):
        with pytest.raises(ValueError, match="auto"):
            DistributedDataParallel(net, bucket_cap_mb="auto", **kwargs)


def test_gradients_equal_torchs_ddp_at_every_iteration_while_tuning_and_after():
    ranks = launch(autotune_cases.equal_to_torch_while_tuning, 2, "gloo", timeout_s=60, deadline_s=300)
    for name, (error, result, tried) in ranks[0].items():
        assert error < (5e-3 if "fp16" in name else 1e-9), name
        assert result is not None and result["iterations"] <= BUDGET_ITERS, name
        assert set(tried) == {0.0, 0.001, 25.0}, name  # three layouts, rebuilt between trials
        assert ranks[1][name][1:] == (result, tried), name  # every rank settled on the same cap


def test_a_join_context_stops_the_search_where_every_rank_is():
    ranks = launch(autotune_cases.stopped_by_join, 2, "gloo", timeout_s=60, deadline_s=120)
    assert ranks[0] == ranks[1]
    result, trials = ranks[0]
    assert "join" in result["reason"] and result["iterations"] == 6 and trials == 2  # 0 MiB and the default


def test_a_stray_forward_on_one_rank_and_copies_mid_search_keep_the_ranks_agreed():
    ranks = launch(autotune_cases.stray_forward_and_copies, 2, "gloo", timeout_s=60, deadline_s=120)
    assert ranks[0] == ranks[1]  # the same trials, times and choice on both ranks
    result, log, (copy_cap, copy_log, copy_tuning, saved) = ranks[0]
    assert result is not None and {t["cap_mb"] for t in log} == {0.0, 25.0}
    assert (copy_cap, copy_log, copy_tuning, saved) == (25.0, [], True, True)
