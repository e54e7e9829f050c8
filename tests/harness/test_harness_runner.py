"""Training-iteration rows for every impl, the shared timed iteration, and the allreduce microbenchmark."""

import contextlib
import json
import math

import pytest
import torch

from harness.config import AllreduceConfig, TrainConfig
from harness.launch.spawn import RankContext
from harness.sweep import run_point
from harness.workloads.models import build_model, input_spec, make_inputs
from harness.workloads.runner import timed_iteration


def _ours_available():
    try:
        from ddp_impl import DistributedDataParallel  # noqa: F401
    except ImportError:
        return False
    return True


def _small(**kw):
    base = dict(model="small", world_size=2, iters=4, warmup=1, threads_per_rank=1, timeout_s=60, net="loopback")
    return TrainConfig(**{**base, **kw})


def _check_common(rows, cfg):
    assert len(rows) == cfg.world_size * cfg.iters
    assert sorted({(r["rank"], r["iteration"]) for r in rows}) == [
        (rank, it) for rank in range(cfg.world_size) for it in range(cfg.iters)
    ]
    for r in rows:
        assert r["total_ms"] == pytest.approx(r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"])
        assert r["cpu_ms"] >= 0 and 0 <= r["sys_ms"] <= r["cpu_ms"] + 1e-6 and r["minor_faults"] >= 0
        assert min(r["forward_ms"], r["backward_ms"], r["backward_compute_ms"]) > 0
        assert math.isfinite(r["loss"]) and r["num_threads"] == 1 and r["impl"] == cfg.impl
        assert r["image_size"] == 16 and r["batch_size_used"] == 8  # cpu profile of the small model


def test_torch_ddp_rows_use_torch_logger_and_no_sync():
    cfg = _small(impl="torch", sync_every=2)
    rows = run_point(cfg)
    _check_common(rows, cfg)
    # warmup is iteration -1 (synced=False); measured iterations 0 and 2 are the 2nd and 4th: synced
    assert [r["synced"] for r in rows if r["rank"] == 0] == [True, False, True, False]
    for r in rows:
        if r["synced"]:
            assert r["breakdown_source"] == "torch_logger"
            assert r["ddp_backward_comm_ms"] > 0
            assert r["backward_comm_exposed_ms"] == pytest.approx(r["ddp_backward_comm_ms"] - r["ddp_overlap_ms"])
            # torch's interval starts at the end of DDP's forward, before the loss is computed, so it lies within
            # forward + backward, not within backward (the loss, or a preemption before it, counts in it)
            assert r["backward_compute_ms"] <= r["forward_ms"] + r["backward_ms"] + 0.01
        else:
            assert r["breakdown_source"] == "host" and r["backward_comm_exposed_ms"] == 0.0
            assert r["optimizer_ms"] < 50 and math.isnan(r["ddp_backward_comm_ms"])


def test_local_rows_have_no_communication():
    cfg = _small(impl="local", world_size=1)
    rows = run_point(cfg)
    _check_common(rows, cfg)
    assert all(r["backward_comm_exposed_ms"] == 0.0 and r["breakdown_source"] == "host" for r in rows)
    assert all(r["backward_compute_ms"] == r["backward_ms"] and r["synced"] for r in rows)


@pytest.mark.skipif(not _ours_available(), reason="ddp_impl.DistributedDataParallel not written yet")
@pytest.mark.parametrize("extra", [dict(), dict(overlap=False, round_robin_groups=2, bucket_cap_mb=0.01)])
def test_our_ddp_rows_carry_bucket_timestamps(extra):
    cfg = _small(impl="ours", **extra)
    rows = run_point(cfg)
    _check_common(rows, cfg)
    for r in rows:
        assert r["breakdown_source"] == "ours" and r["backward_comm_exposed_ms"] >= 0
        buckets = json.loads(r["bucket_times_json"])
        assert len(buckets["launch_ms"]) == len(buckets["finish_ms"]) >= 1
        assert all(f >= s for s, f in zip(buckets["launch_ms"], buckets["finish_ms"]))


def test_an_autotune_point_measures_the_settled_cap_and_stores_its_search():
    cfg = _small(impl="ours", bucket_cap_mb="auto", autotune_prior_mb="0,0.01", warmup=1, iters=3, sync_every=2)
    rows = run_point(cfg)
    _check_common(rows, cfg)
    assert all(math.isnan(r["bucket_cap_mb"]) and r["autotune"] for r in rows)
    for rank in range(2):
        mine = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["iteration"])
        search = json.loads(mine[-1]["autotune_json"])
        assert {0.0, 0.01, 25.0} == {t["cap_mb"] for t in search["log"]}  # the prior's two and the default
        settled = search["result"]["iterations"]  # the synchronized iteration whose forward settled it
        assert {(r["bucket_cap_mb_used"], r["autotune_iterations"]) for r in mine} == {
            (search["result"]["cap_mb"], 2 * settled)  # sync_every=2: a synchronized iteration in two
        }


class _NoSyncCounter(torch.nn.Module):
    """A model whose ``no_sync()`` only counts how often it was entered."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.no_sync_entered = inner, 0

    def forward(self, x):
        return self.inner(x)

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_entered += 1
        yield


def test_timed_iteration_accumulates_without_step_and_steps_when_told():
    """The runner's semantics: ``no_sync`` wraps forward + backward; only ``step`` runs the optimizer, which
    then zeroes the gradients in place (``set_to_none=False``)."""
    ctx = RankContext(
        rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"), num_threads=1, timeout_s=60
    )
    torch.manual_seed(0)
    model = _NoSyncCounter(build_model("small"))
    inputs = make_inputs("small", input_spec("small", "cpu"), ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = [p.detach().clone() for p in model.parameters()]
    times, loss = timed_iteration("small", model, opt, inputs, ctx, no_sync=True, step=False)
    assert model.no_sync_entered == 1 and math.isfinite(float(loss.detach()))
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))  # accumulated, not stepped
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())
    assert times["total_ms"] == pytest.approx(times["forward_ms"] + times["backward_ms"] + times["optimizer_ms"])
    assert set(times) == {"forward_ms", "backward_ms", "optimizer_ms", "total_ms", "cpu_ms", "sys_ms", "minor_faults"}
    timed_iteration("small", model, opt, inputs, ctx)
    assert model.no_sync_entered == 1
    assert not all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_allreduce_microbenchmark_rows():
    cfg = AllreduceConfig(
        world_size=3,
        total_params=300_000,
        params_per_call=70_000,
        iters=3,
        warmup=1,
        threads_per_rank=1,
        timeout_s=60,
        net="loopback",
    )
    rows = run_point(cfg)
    assert len(rows) == 9 and {r["rank"] for r in rows} == {0, 1, 2}
    for r in rows:
        assert r["num_calls"] == 5 and r["total_bytes"] == 1_200_000  # 4 calls of 70k + one of 20k
        assert r["algbw_gbps"] == pytest.approx(r["total_bytes"] / (r["total_ms"] / 1e3) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 4 / 3)
        assert r["call_ms"] == pytest.approx(r["total_ms"] / 5)


def test_seeded_model_copies_equal_a_fresh_build_and_leave_the_same_random_state():
    from harness.workloads.models import seeded_model

    first = seeded_model("small", 3)
    after_first = torch.rand(3)
    second = seeded_model("small", 3)  # from the process's cache
    after_second = torch.rand(3)
    torch.manual_seed(3)
    fresh = build_model("small")
    after_fresh = torch.rand(3)
    assert second is not first and all(
        p.data_ptr() != q.data_ptr() for p, q in zip(first.parameters(), second.parameters())
    )
    for a, b, c in zip(first.parameters(), second.parameters(), fresh.parameters()):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert torch.equal(after_first, after_fresh) and torch.equal(after_second, after_fresh)
    assert not torch.equal(next(seeded_model("small", 4).parameters()), next(fresh.parameters()))
