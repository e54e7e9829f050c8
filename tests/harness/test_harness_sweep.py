"""Resumable sweeps: a killed sweep resumes without loss or duplicates; a failing point is isolated."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

import harness.sweep as sweep
import harness.sweep_order as sweep_order
from harness.config import TrainConfig, point_id
from harness.results import stored_point_ids

REPO = Path(__file__).resolve().parents[2]

POINTS_SRC = """
from harness.config import TrainConfig
POINTS = [TrainConfig(model="small", impl="local", world_size=1, iters=2, warmup=1, seed=s,
                      threads_per_rank=1, timeout_s=60) for s in range(4)]
"""


def _points():
    scope = {}
    exec(POINTS_SRC, scope)
    return scope["POINTS"]


def test_killed_sweep_resumes_without_loss_or_duplicates(tmp_path):
    script = tmp_path / "sweep_job.py"
    script.write_text(
        POINTS_SRC
        + textwrap.dedent(f"""
        from harness.sweep import run_sweep
        if __name__ == "__main__":
            run_sweep("resume", POINTS, root={str(tmp_path)!r}, progress=False)
    """)
    )
    points_dir = tmp_path / "resume" / "points"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not stored_point_ids("resume", root=tmp_path):
            assert job.poll() is None, job.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "first point never stored"
            time.sleep(0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the sweep and the ranks it spawned
        job.wait()
    before = {p.name: p.stat().st_mtime_ns for p in points_dir.glob("*.csv")}
    assert 1 <= len(before) < 4, "the kill must land mid-sweep"

    df = sweep.run_sweep("resume", _points(), root=tmp_path, progress=False)

    ids = {point_id(p) for p in _points()}
    assert set(df["point_id"]) == ids == stored_point_ids("resume", root=tmp_path)
    assert not df.duplicated(["point_id", "rank", "iteration"]).any()
    assert len(df) == 4 * 2 and (df["error"] == "").all()
    after = {p.name: p.stat().st_mtime_ns for p in points_dir.glob("*.csv")}
    assert {name: after[name] for name in before} == before  # stored points were skipped, not rerun
    assert not [p for p in points_dir.iterdir() if p.name.startswith(".tmp-")]


def test_failing_point_is_stored_and_the_sweep_goes_on(tmp_path, capsys):
    bad = TrainConfig(
        model="small",
        impl="torch",
        world_size=2,
        iters=2,
        warmup=0,
        threads_per_rank=1,
        timeout_s=60,
        fault="raise@1",
        net="loopback",
    )
    good = TrainConfig(model="small", impl="local", world_size=1, iters=2, warmup=0, threads_per_rank=1, timeout_s=60)
    df = sweep.run_sweep("isolation", [bad, good], root=tmp_path)
    err = capsys.readouterr().err
    assert "2/2" in err and "failed" in err  # progress bar reached the end; failure reported
    failed = df[df["point_id"] == point_id(bad)]
    assert len(failed) == 1 and "injected fault on rank 1" in failed["error"].iloc[0]
    assert failed["failed_rank"].iloc[0] == 1 and failed["cause"].iloc[0] == "RuntimeError: injected fault on rank 1"
    assert failed["fault"].iloc[0] == "raise@1" and failed["rank"].isna().all()
    ok = df[df["point_id"] == point_id(good)]
    assert len(ok) == 2 and (ok["error"] == "").all() and ok["total_ms"].notna().all()


def test_dry_run_lists_points_and_launches_nothing(tmp_path, monkeypatch, capsys):
    points = _points()
    from harness.config import config_columns, validate
    from harness.results import write_point

    write_point("dry", point_id(points[0]), [{**config_columns(validate(points[0])), "rank": 0}], root=tmp_path)
    monkeypatch.setattr(sweep._Pools, "get_for", lambda *a, **k: pytest.fail("dry run launched a point"))
    plan = sweep.run_sweep("dry", points + [points[1]], root=tmp_path, dry_run=True)
    ids = [point_id(p) for p in points]
    assert sorted(plan["point_id"]) == sorted(ids)  # duplicate listed once, in the run order:
    assert list(plan["point_id"]) == list(sweep.schedule(dict(zip(ids, points)), seed=0))
    assert dict(zip(plan["point_id"], plan["status"])) == {
        ids[0]: "stored",
        ids[1]: "pending",
        ids[2]: "pending",
        ids[3]: "pending",
    }
    assert point_id(points[2]) in capsys.readouterr().out
    assert isinstance(plan, pd.DataFrame) and sorted(plan["seed"]) == [0, 1, 2, 3]


def test_schedule_runs_one_shuffled_pass_per_repetition():
    points = {f"{r}-{i}": TrainConfig(seed=i, repeat=r) for r in range(3) for i in range(6)}
    order = list(sweep.schedule(points, seed=0))
    assert [points[pid].repeat for pid in order] == [0] * 6 + [1] * 6 + [2] * 6
    passes = [[points[pid].seed for pid in order[6 * r : 6 * r + 6]] for r in range(3)]
    assert all(sorted(p) == list(range(6)) for p in passes) and len({tuple(p) for p in passes}) > 1  # shuffled
    assert order == list(sweep.schedule(points, seed=0))  # a rerun or a resume keeps the order
    assert order != list(sweep.schedule(points, seed=1))


def test_idle_pools_are_closed_before_a_new_one_starts_when_memory_runs_low(monkeypatch):
    import contextlib

    with contextlib.ExitStack() as stack:
        pools = sweep._Pools(stack)
        first = pools.get_for(TrainConfig(world_size=1), None)
        monkeypatch.setattr(sweep, "available_memory_fraction", lambda: 0.9)
        pools.get_for(TrainConfig(world_size=2), None)
        assert len(pools) == 2  # plenty of memory: both kept
        monkeypatch.setattr(sweep, "available_memory_fraction", lambda: 0.1)
        third = pools.get_for(TrainConfig(world_size=3), None)
        assert list(pools.values()) == [third] and first not in pools.values()


def test_a_point_measuring_memory_gets_fresh_ranks(monkeypatch):
    import contextlib

    with contextlib.ExitStack() as stack:
        pools = sweep._Pools(stack)
        first = pools.get_for(TrainConfig(world_size=1), None)
        assert pools.get_for(TrainConfig(world_size=1), None) is first  # kept between ordinary points
        fresh = pools.get_for(TrainConfig(world_size=1, memory=True), None, fresh=True)
        assert fresh is not first and list(pools.values()) == [fresh]
    asked = []
    monkeypatch.setattr(sweep._Pools, "get_for", lambda self, cfg, rate, fresh=False: asked.append(fresh) or 1 / 0)
    for memory in (False, True):
        with pytest.raises(ZeroDivisionError), contextlib.ExitStack() as stack:
            sweep._measure([TrainConfig(world_size=2, memory=memory, net="loopback")], None, sweep._Pools(stack))
    assert asked == [False, True]


@pytest.mark.parametrize("memory", [False, True])
def test_a_point_measuring_memory_is_measured_again_when_a_rank_crashes(memory, capsys):
    """torch's memory profiler occasionally crashes a rank: a memory point gets one more try on fresh ranks (this
    crash is deterministic, so the second try fails too and its error is raised); any other point fails at once."""
    cfg = TrainConfig(
        model="small",
        impl="torch",
        world_size=2,
        iters=1,
        warmup=0,
        threads_per_rank=1,
        timeout_s=60,
        fault="segv@1",
        net="loopback",
        memory=memory,
    )
    with pytest.raises(sweep.LaunchError, match=r"rank 1 crashed \(SIGSEGV\)"):
        sweep.run_point(cfg)
    assert capsys.readouterr().err.count("crashed measuring memory; measuring the point again") == int(memory)


def _caps(caps, repeats=1, **kw):
    from harness.config import validate

    points = [
        validate(TrainConfig(model="resnet50", bucket_cap_mb=c, repeat=r, **kw)) for r in range(repeats) for c in caps
    ]
    return sweep.schedule({point_id(p): p for p in points}, seed=0)


def test_points_differing_only_in_how_they_train_are_measured_together():
    points = _caps([0, 5, 25, 1000], repeats=2)
    alone = {
        point_id(p): p
        for p in (
            TrainConfig(model="resnet50", memory=True),
            TrainConfig(model="resnet50", fault="raise@0"),
            TrainConfig(model="small", bucket_cap_mb=5.0),
        )
    }
    tasks = sweep.interleaved_groups({**points, **alone}, available_bytes=1e12)
    assert [sorted(points[pid].bucket_cap_mb for pid in task) for task in tasks[:2]] == [[0, 5, 25, 1000]] * 2
    assert [{points[pid].repeat for pid in task} for task in tasks[:2]] == [{0}, {1}]  # one task per repetition
    assert [task[0] for task in tasks[:2]] == [next(iter(points)), list(points)[4]]  # where its first point was
    assert tasks[2:] == [[pid] for pid in alone]  # memory measurement, a fault, another model: alone


def test_a_group_too_big_for_memory_shares_its_anchor_between_tasks():
    points = _caps([0, 1, 5, 25, 100, 1000])
    per_trainer = 2 * sweep_order.TRAINER_COPIES["sgd"] * sweep_order._param_bytes(next(iter(points.values())))
    tasks = sweep.interleaved_groups(points, available_bytes=3.5 * per_trainer / sweep_order.MEMORY_SHARE)  # 3 a task
    anchor = next(pid for pid, p in points.items() if p.bucket_cap_mb == 25)  # torch's default cap
    assert len(tasks) == 3 and all(task[0] == anchor and len(task) <= 3 for task in tasks)
    assert sorted(pid for task in tasks for pid in task[1:]) == sorted(set(points) - {anchor})
    tasks = sweep.interleaved_groups(points, available_bytes=1.5 * per_trainer / sweep_order.MEMORY_SHARE)
    assert tasks == [[pid] for pid in points]  # no room for two: each alone


def test_interleaved_points_train_as_they_would_alone(tmp_path, monkeypatch):
    """Three caps in one task (and in two tasks sharing the 25 MiB anchor when memory is short): every point's
    losses equal its losses measured alone, so no trainer touched another's gradients; each round runs every
    point once in a fresh order."""
    base = dict(model="small", world_size=2, iters=3, warmup=1, threads_per_rank=1, timeout_s=60, net="loopback")
    points = [TrainConfig(bucket_cap_mb=c, **base) for c in (0.0, 25.0, 1000.0)]
    together = sweep.run_sweep("together", points, root=tmp_path, progress=False)
    alone = pd.concat(
        [sweep.run_sweep("alone", [p], root=tmp_path / str(i), progress=False) for i, p in enumerate(points)]
    )
    key = ["point_id", "rank", "iteration"]
    merged = together.merge(alone, on=key, suffixes=("", "_alone"))
    assert len(merged) == len(together) == 3 * 2 * 3 and (together["error"] == "").all()
    assert (merged["loss"] - merged["loss_alone"]).abs().max() < 1e-6
    assert together["group"].nunique() == 1 and sorted(together["group"].iloc[0].split("+")) == sorted(
        together["point_id"].unique()
    )
    assert (alone["group"] == alone["point_id"]).all()
    assert alone.get("round_position", pd.Series(dtype=float)).isna().all()
    rounds = together.groupby(["rank", "iteration"])["round_position"].apply(sorted)
    assert all(r == [0, 1, 2] for r in rounds)
    orders = together[together["rank"] == 0].sort_values("round_position").groupby("iteration")["bucket_cap_mb"]
    assert len({tuple(o) for _, o in orders}) > 1  # shuffled anew each round

    per_trainer = 2 * sweep_order.TRAINER_COPIES["sgd"] * sweep_order._param_bytes(points[0])
    monkeypatch.setattr(sweep, "memory_bytes", lambda: (2.5 * per_trainer / sweep_order.MEMORY_SHARE, 1e12))
    split = sweep.run_sweep("split", points, root=tmp_path, progress=False)
    anchor = split[split["bucket_cap_mb"] == 25]
    assert anchor["group"].nunique() == 2 and len(anchor) == 2 * 2 * 3  # in both tasks, all rows kept
    assert split.groupby("bucket_cap_mb")["point_id"].nunique().eq(1).all() and (split["error"] == "").all()
