"""Our DDP against torch's DistributedDataParallel and against single-process training (Gloo, spawned ranks)."""

import pytest

from harness.launch.spawn import launch
from tests.ddp_impl import workers

TOL = 1e-6


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def matrix(request):
    return launch(workers.equivalence_matrix, request.param, "gloo", timeout_s=60, deadline_s=300)


def test_matrix_covers_every_configuration(matrix):
    names = matrix[0].keys()
    for cap in workers.CAPS_MB:
        assert f"convnet cap={cap} overlap=False" in names
    assert {"no_sync accum=4", "find_unused cap=0", "round robin k=3"} <= set(names)


def test_equal_to_torch_ddp(matrix):
    bad = {f"rank{r} {name}": err for r, errors in enumerate(matrix) for name, err in errors.items() if err > TOL}
    assert not bad, f"relative error above {TOL}: {bad}"


def test_equal_to_single_process_on_global_batch():
    for err in launch(workers.global_batch, 2, "gloo", timeout_s=60, deadline_s=300):
        assert err < 1e-5


def test_compression_hooks_match_torch_and_actually_compress():
    for per_rank in launch(workers.compression, 2, "gloo", timeout_s=60, deadline_s=300):
        for name, (vs_torch_hook, vs_fp32) in per_rank.items():
            assert vs_torch_hook < 5e-3, name
            assert 0 < vs_fp32 < 5e-2, name


@pytest.mark.parametrize("rebuild", [True, False])
def test_buckets_rebuilt_in_observed_gradient_order(rebuild):
    ranks = launch(workers.bucket_order, 2, "gloo", args=(rebuild,), timeout_s=60, deadline_s=300)
    before, after = ranks[0]
    if rebuild:  # torch's first iteration: one bucket, registration order
        assert before == [["late.weight", "late.bias", "early.weight", "early.bias"]]
    else:  # the paper's static layout: reverse registration order predicts `early` first
        assert before[0] == ["early.bias"]
    if rebuild:
        assert after[0][0].startswith("late.")  # but `late` produced its gradients first
        assert {after[0][0], after[1][0]} == {"late.weight", "late.bias"}
    else:
        assert after == before
    assert ranks[0] == ranks[1]  # every rank agrees on the mapping


def test_timing_fields_are_consistent():
    for per_rank in launch(workers.timings, 2, "gloo", timeout_s=60, deadline_s=300):
        on, off = per_rank[True], per_rank[False]
        for t in (on, off):
            assert t["forward_compute_time_ms"] > 0 and t["backward_compute_time_ms"] > 0
            assert t["backward_comm_time_ms"] > 0
            assert 0 <= t["backward_compute_comm_overlap_time_ms"] <= t["backward_comm_time_ms"]
            assert all(f >= s for s, f in zip(t["bucket_launch_ms"], t["bucket_finish_ms"]))
            assert t["bucket_launch_ms"] == sorted(t["bucket_launch_ms"])  # launched in index order
        assert on["bucket_launch_ms"][0] < on["backward_end_ms"]  # overlap: first bucket leaves during backward
        assert off["bucket_launch_ms"][0] >= off["backward_end_ms"]
        assert off["backward_compute_comm_overlap_time_ms"] == 0


def test_the_gpu_checks_matrix_passes_on_cpu():
    """make gpu-check's comparisons (experiments.parity.device_matrix), float64 and float32, on Gloo CPU ranks."""
    for errors in launch(workers.device_matrix_cpu, 2, "gloo", timeout_s=60, deadline_s=300):
        assert len(errors) == 13 and {"fp16 hook float32", "overlap=False float64"} <= set(errors)
        bad = {name: err for name, err in errors.items() if err > (5e-3 if "fp16" in name else 1e-6)}
        assert not bad, bad


def test_timing_on_an_event_clock_creates_no_event_after_warmup_and_stamps_per_bucket_only_when_tracing():
    """CUDA's clock (events, here on the host's clock): the default stamps a fixed set per iteration whatever the
    cap, from two reused sets; tracing adds every bucket's launch and finish, and its completion stamped by the
    communication thread on events of its own. Both still give the phases."""
    (got,) = launch(workers.event_stamps, 1, "gloo", timeout_s=60, deadline_s=120)
    for (cap, mode), r in got.items():
        in_sets, t, buckets = r["in_sets"], r["timing"], r["buckets"]
        assert in_sets[3] == in_sets[-1], (cap, mode, in_sets)  # nothing new once both sets exist (rebuilt)
        launched = [x for x in t["bucket_launch_ms"] if x is not None]
        finished = [x for x in t["bucket_finish_ms"] if x is not None]
        if mode == "trace":
            assert len(launched) == len(finished) == buckets
            assert r["created"] <= in_sets[-1] + 6 * buckets  # plus at most one completion event per bucket
        else:
            assert len(launched) == 1 and not finished and r["created"] == in_sets[-1] == 2 * 6, (cap, r)
        assert 0 < t["forward_compute_time_ms"] <= t["backward_start_ms"] <= t["backward_end_ms"] <= t["comm_end_ms"]
        assert t["backward_comm_time_ms"] >= 0 and t["exposed_comm_time_ms"] >= 0
    assert got[(0, "trace")]["buckets"] > 1  # cap 0: one bucket per parameter
