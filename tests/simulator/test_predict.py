"""What ``simulator.model.scenario`` adds to the simulation (DDP's copies, the buffer broadcast), the calibration file,
and the `predict` command end to end (small model, loopback: a functional check, not a timing one)."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from simulator import AlphaBeta, ComputeProfile
from simulator.model.calibration import VERSION, Calibration
from simulator.model.scenario import Scenario, predict, with_bucket_copies
from tests.in_process import run_experiments

# 400-byte gradients ready at 4 ms (p1) and 10 ms (p0); copying costs 0.005 ms per byte (2 ms per gradient)
TWO = ComputeProfile(param_bytes=(400, 400), ready_ms=(10.0, 4.0), backward_ms=10.0, forward_ms=5.0, optimizer_ms=2.0)


def _calibration(buffer_bytes=0, copy=0.005):
    return Calibration(
        profile=TWO,
        comm=AlphaBeta(0.5, 0.01),
        copy_ms_per_byte=copy,
        buffer_bytes=buffer_bytes,
        point=dict(model="small", profile="cpu", world_size=2, backend="gloo", net="1gbit", net_rate_mbit=1000.0),
        fit={},
        meta=dict(version=VERSION, created_at="now"),
    )


def test_bucket_copies_delay_every_later_gradient():
    copied = with_bucket_copies(TWO, 0.005)
    # p1 first: ready 4 + its own copy 2 = 6; p0: 10 + both copies 4 = 14; backward 10 + 4
    assert copied.ready_ms == pytest.approx((14.0, 6.0)) and copied.backward_ms == pytest.approx(14.0)


def test_prediction_adds_copies_and_the_buffer_broadcast():
    # cap 0: one bucket each. Copies: p1 ready 6, p0 14 (as above). Bucket 0 (p1) runs 6 -> 6+1+4 = 11; bucket 1
    # (p0) 14 -> 19; backward ends 19, then the copy out of 800 bytes (4 ms): 23. Broadcast of 100 buffer bytes:
    # allreduce(100) / 2 = (1 + 1) / 2 = 1 ms more forward. Total 5 + 1 + 23 + 2 = 31.
    out = predict(_calibration(buffer_bytes=100), Scenario(bucket_cap_mb=0))
    assert out["predicted_ms"] == pytest.approx(31.0) and out["num_buckets"] == 2
    assert out["buffer_broadcast_ms"] == pytest.approx(1.0) and out["backward_ms"] == pytest.approx(23.0)
    # no_sync every 2: the local iteration has no copies and no communication but still the broadcast:
    # 5 + 1 + 10 = 16, mean (31 + 16) / 2
    assert predict(_calibration(buffer_bytes=100), Scenario(0, sync_every=2))["predicted_ms"] == pytest.approx(23.5)


def test_calibration_files_round_trip_and_refuse_other_versions(tmp_path):
    cal = _calibration()
    path = cal.save(tmp_path / "c.json")
    assert Calibration.load(path) == cal
    raw = json.loads(path.read_text())
    raw["meta"]["version"] = VERSION + 1
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="probe again"):
        Calibration.load(path)
    with pytest.raises(ValueError, match="probe again"):
        Calibration.load(path, stored_run=True)  # not an earlier version this one reads


def test_a_stored_run_of_the_version_before_host_costs_draws_as_it_predicted(tmp_path):
    raw = asdict(_calibration())
    raw["meta"]["version"] = 10
    for key in ("host_per_gradient_ms", "host_per_bucket_ms"):
        del raw[key]
    path = tmp_path / "v10.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="probe again"):
        Calibration.load(path)  # never reused for a new prediction
    old = Calibration.load(path, stored_run=True)
    assert (old.host_per_gradient_ms, old.host_per_bucket_ms) == (0.0, 0.0)


def _predict(*args, cwd):
    return run_experiments("predict", *args, cwd=cwd, env={"DDP_REPRO_RESULTS": str(cwd / "results")})


def test_predict_command_probes_stores_and_reuses_a_calibration(tmp_path):
    done = _predict("--model=small", "--net=loopback", "--bucket_cap_mb=1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["predicted_ms"] > 0 and out["point"]["model"] == "small" and out["point"]["bucket_cap_mb"] == 1
    stored = Path(out["calibration"])
    assert stored.exists()
    cal = Calibration.load(stored)
    assert cal.point["world_size"] == 2
    # compute was timed after DDP's own iterations, whose phases are kept beside compute timed before any
    assert set(cal.ddp) == {"forward_ms", "backward_ms", "optimizer_ms", "total_ms"} and cal.ddp["total_ms"] > 0
    before_ddp = cal.compute_before_ddp
    assert set(before_ddp) == {"forward_ms", "backward_ms", "optimizer_ms"} and before_ddp["backward_ms"] > 0
    assert cal.fit["calls_done_ms"] > 0  # what alpha was derived from, kept so that a later model can re-derive it
    # and when backward's compute ended beside those calls, which gave the share of their latency that slows it
    assert cal.fit["calls_backward_ms"] > 0 and 0 <= cal.profile.latency_contention <= 1
    # DDP's host work from the stand-in on each rank, per round the slowest rank's. A launch per bucket costs far
    # above noise (400 buckets: ~5x the backward); what DDP's hook adds over a hook that stamps is near it on a CPU
    # (2-8 us a gradient across runs, so an honest zero where the medians' difference falls below the launches')
    assert len(cal.fit["host_cost"]) == 2 and all(len(h["backward_ms"]) == 3 for h in cal.fit["host_cost"])
    assert cal.host_per_bucket_ms > 0 and cal.host_per_gradient_ms >= 0
    again = _predict(
        "--model=small", "--net=loopback", "--bucket_cap_mb=1", "--json", f"--calibration={stored}", cwd=tmp_path
    )
    assert json.loads(again.stdout.strip().splitlines()[-1])["predicted_ms"] == pytest.approx(out["predicted_ms"])
    # again without --calibration: within REFRESH_HOURS only the compute is re-timed, the rest kept as probed
    refreshed = _predict("--model=small", "--net=loopback", "--bucket_cap_mb=1", cwd=tmp_path)
    assert refreshed.returncode == 0, refreshed.stderr
    assert f"probed {cal.meta['created_at']}" in refreshed.stdout
    fresh = Calibration.load(stored)
    assert fresh.meta["probed_at"] == cal.meta["created_at"] and fresh.comm == cal.comm and fresh.fit == cal.fit
    assert fresh.profile.contention == cal.profile.contention and fresh.profile.param_bytes == cal.profile.param_bytes
    assert fresh.profile.backward_ms != cal.profile.backward_ms  # measured again
    assert (fresh.host_per_gradient_ms, fresh.host_per_bucket_ms) == (cal.host_per_gradient_ms, cal.host_per_bucket_ms)
    full = _predict("--model=small", "--net=loopback", "--probe=full", "--json", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    assert "probed_at" not in Calibration.load(stored).meta
    both = _predict("--model=small", f"--calibration={stored}", "--probe=full", cwd=tmp_path)
    assert both.returncode != 0 and "exclude each other" in both.stderr
    wrong = _predict("--model=resnet50", f"--calibration={stored}", cwd=tmp_path)
    assert wrong.returncode != 0 and "was probed with model='small'" in wrong.stderr


def test_a_one_rank_probe_of_one_iteration_calibrates(tmp_path, monkeypatch):
    from harness import TrainConfig
    from simulator.probe.calibrate import calibrate

    # compute is timed after DDP's iterations at one rank too; with one warm-up and one measured iteration none of
    # DDP's is past its bucket rebuild, so its phases (kept for the record only) stay empty instead of failing
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path))
    cal = calibrate(TrainConfig(model="small", world_size=1, iters=1, warmup=1))
    assert cal.ddp == {} and cal.profile.backward_ms > 0 and cal.host_per_bucket_ms >= 0


def test_prediction_charges_the_calibrations_host_work_on_backwards_thread():
    from dataclasses import replace

    cal = _calibration(copy=0.0)
    plain, host = (
        predict(c, Scenario(bucket_cap_mb=0))
        for c in (cal, replace(cal, host_per_gradient_ms=0.5, host_per_bucket_ms=2.0))
    )
    # two gradients, two buckets: 2 x (0.5 + 2) on backward's thread, after which the last call starts that much later
    assert host["host_ms"] == pytest.approx(5.0) and plain["host_ms"] == 0
    assert host["bucket_ready_ms"][-1] - plain["bucket_ready_ms"][-1] == pytest.approx(5.0)


def test_a_stored_full_probe_is_refreshed_within_a_day_and_redone_after(tmp_path, monkeypatch):
    import datetime
    from dataclasses import replace

    import simulator.probe.calibrate as calibrate_module
    from experiments.tools.calibrations import REFRESH_HOURS, calibration_for, calibration_path
    from harness import TrainConfig
    from harness.config import validate
    from harness.workloads.runner import machine_metadata

    cfg = validate(TrainConfig(model="small", world_size=2, net="1gbit"))
    done = []
    monkeypatch.setattr(calibrate_module, "calibrate", lambda c, root: done.append("full") or _calibration())
    monkeypatch.setattr(calibrate_module, "refresh", lambda cal, c: done.append("refresh") or cal)

    def stored(hours_ago, **meta):
        when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=hours_ago)
        cal = _calibration()
        cal = replace(cal, meta={**cal.meta, **machine_metadata(), "created_at": when.isoformat(), **meta})
        cal.save(calibration_path(cfg, tmp_path))

    def probe(**kw):
        done.clear()
        calibration_for(cfg, root=tmp_path, **kw)
        return done[0]

    assert probe() == "full"  # nothing stored
    stored(REFRESH_HOURS - 1)
    assert probe() == "refresh" and probe(probe="full") == "full"
    stored(REFRESH_HOURS + 1)
    assert probe() == "full"
    stored(1, torch_version="0.0")  # another torch since the probe
    assert probe() == "full"
    stored(1, created_at="not a time")
    assert probe() == "full"


def test_a_gpus_probe_times_more_iterations_than_a_cpus(tmp_path, monkeypatch):
    """On a GPU an iteration takes tens of ms, and 3 after 1 warm-up read an H100 far off fig7: 20 after 5 there."""
    import simulator.probe.calibrate as calibrate_module
    from experiments.tools.calibrations import calibration_for
    from harness import TrainConfig

    probed = []
    monkeypatch.setattr(calibrate_module, "calibrate", lambda c, root: probed.append(c) or _calibration())
    for backend in ("gloo", "nccl"):
        calibration_for(TrainConfig(model="small", world_size=2, backend=backend, iters=50), root=tmp_path)
    assert [(c.backend, c.iters, c.warmup) for c in probed] == [("gloo", 3, 1), ("nccl", 20, 5)]


def test_the_link_comes_from_make_fig2s_stored_calls_on_the_same_link(tmp_path):
    from harness.results import load_results
    from harness.workloads.collectives import call_samples
    from simulator.model.comm import fit_link

    fig2 = run_experiments(
        "fig2",
        "--net=loopback",
        "--backends=gloo",
        "--total_params=600000",
        "--params_per_call=60000,600000",
        "--compute_model=small",
        "--iters=2",
        "--warmup=1",
        "--repeats=1",
        cwd=tmp_path,
        env={"DDP_REPRO_RESULTS": str(tmp_path / "results")},
    )
    assert fig2.returncode == 0, fig2.stderr
    done = _predict("--model=small", "--net=loopback", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cal = Calibration.load(json.loads(done.stdout.strip().splitlines()[-1])["calibration"])
    assert cal.fit["link"].startswith("make fig2's stored calls (2 points on loopback")
    stored = call_samples(load_results("fig2", tmp_path / "results").query("point_type == 'AllreduceConfig'"))
    assert cal.fit["samples"] == len(stored) == 2  # fig2's two call sizes, nothing the probe timed itself
    assert cal.comm.beta_ms_per_byte == pytest.approx(fit_link(stored).model.beta_ms_per_byte)
    # at 3 ranks fig2 stored nothing: the probe runs the microbenchmark itself (six sizes, three calls each)
    three = _predict("--model=small", "--net=loopback", "--world_size=3", "--json", cwd=tmp_path)
    assert three.returncode == 0, three.stderr
    cal3 = Calibration.load(json.loads(three.stdout.strip().splitlines()[-1])["calibration"])
    assert cal3.fit["link"].startswith("probed now") and cal3.fit["samples"] > 2
