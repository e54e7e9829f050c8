"""The launcher: world sizes 1-3, failing/dead/hung ranks end the launch with an error, in-place mode, and how
every rank ends (its groups destroyed, their Gloo threads joined, before the interpreter finalizes)."""

import multiprocessing
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness.launch.allocator import MALLOC_ENV
from harness.launch.env import available_cores
from harness.launch.failures import root_cause
from harness.launch.faults import inject_fault
from harness.launch.groups import end_rank
from harness.launch.spawn import LaunchError, RankPool, find_free_port, launch

REPO = Path(__file__).resolve().parents[2]


def _sum_ranks(ctx, fault=""):
    inject_fault(fault, ctx.rank)
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return {
        "rank": ctx.rank,
        "sum": t.item(),
        "threads": torch.get_num_threads(),
        "ctx_threads": ctx.num_threads,
        "world": dist.get_world_size(),
        "backend": dist.get_backend(),
    }


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_launch_runs_every_rank(world_size):
    out = launch(_sum_ranks, world_size, "gloo", timeout_s=60)
    assert [r["rank"] for r in out] == list(range(world_size))
    expected_threads = max(1, available_cores() // world_size)
    for r in out:
        assert r["sum"] == world_size * (world_size + 1) / 2
        assert r["world"] == world_size and r["backend"] == "gloo"
        assert r["threads"] == r["ctx_threads"] == expected_threads


@pytest.mark.parametrize(
    "fault, cause", [("raise@1", "RuntimeError: injected fault on rank 1"), ("exit@1", "exited with code 3")]
)
def test_failing_or_dead_rank_fails_the_launch_naming_it_as_the_cause(fault, cause):
    """The failed rank is the cause even when its peer reports first what it saw of it (a connection reset)."""
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(_sum_ranks, 2, "gloo", args=(fault,), timeout_s=60, threads=1)
    assert (err.value.failed_rank, err.value.cause) == (1, cause)
    assert str(err.value).startswith(f"rank 1 failed first: {cause}")
    assert time.monotonic() - start < 45  # noticed promptly, not after the 60 s group timeout


def test_a_crashed_rank_is_named_and_prints_its_python_stack(capfd):
    with pytest.raises(LaunchError, match=r"rank 1 crashed \(SIGSEGV\)") as err:
        launch(_sum_ranks, 2, "gloo", args=("segv@1",), timeout_s=60, threads=1)
    assert err.value.crashed == (1,) and (err.value.failed_rank, err.value.cause) == (1, "killed by SIGSEGV")
    assert "Fatal Python error: Segmentation fault" in capfd.readouterr().err  # faulthandler in the rank
    with pytest.raises(LaunchError) as err:
        launch(_sum_ranks, 2, "gloo", args=("exit@1",), timeout_s=60, threads=1)
    assert err.value.crashed == ()  # an exit is not a crash


def test_hung_rank_hits_the_group_timeout():
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(_sum_ranks, 2, "gloo", args=("hang@1",), timeout_s=3, threads=1)
    assert "rank 0" in str(err.value)  # the healthy rank's collective timed out and reported it
    assert time.monotonic() - start < 40


def _pid(ctx, fault=""):
    inject_fault(fault, ctx.rank)
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return [os.getpid(), t.item()]


def check_pool_keeps_ranks_until_a_failure(pool):
    """Shared with the namespace pool's test: launches reuse the ranks; a failure ends them, the next launch
    starts fresh ones and computes correctly."""
    first = pool.run(_pid, (), 60)
    assert pool.run(_pid, (), 60) == first and [s for _, s in first] == [3.0, 3.0]
    assert len({pid for pid, _ in first}) == 2
    with pytest.raises(LaunchError, match="injected fault on rank 1"):
        pool.run(_pid, ("raise@1",), 60)
    again = pool.run(_pid, (), 60)
    assert [s for _, s in again] == [3.0, 3.0] and not {pid for pid, _ in again} & {pid for pid, _ in first}


def test_a_rank_pool_reuses_its_ranks_and_restarts_after_a_failure():
    with RankPool(2, "gloo", timeout_s=60, threads=1) as pool:
        check_pool_keeps_ranks_until_a_failure(pool)


def test_in_place_when_rank_is_set(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    threads = torch.get_num_threads()
    try:
        out = launch(_sum_ranks, 1, "gloo", timeout_s=60, threads=1)
        assert out == [dict(rank=0, sum=1.0, threads=1, ctx_threads=1, world=1, backend="gloo")]
        assert dist.is_initialized() and not multiprocessing.active_children()  # ran here, no child
        with pytest.raises(ValueError, match="WORLD_SIZE=1"):
            launch(_sum_ranks, 2, "gloo", timeout_s=60)
    finally:
        end_rank()
        torch.set_num_threads(threads)


def test_bad_launch_arguments_raise_before_spawning():
    with pytest.raises(ValueError, match="world_size"):
        launch(_sum_ranks, 0)
    with pytest.raises(ValueError, match="mpi"):
        launch(_sum_ranks, 1, "mpi")


def _build_optimizer_then_end(ctx):
    torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)  # imports torch._dynamo, as every trainer does
    return end_rank()


def test_a_rank_ends_with_its_groups_destroyed_and_their_threads_joined():
    """torch._dynamo imports torch.distributed.nn.functional, whose defaults bind the group that exists then: a
    group created before that import outlived destroy_process_group(), its Gloo threads running into the exit."""
    assert launch(_build_optimizer_then_end, 2, "gloo", timeout_s=60, threads=1) == [[], []]


# `python -m harness` with an exit hook registered before the harness runs, so it runs after the harness's own: the
# Gloo threads left as the interpreter goes on to finalize (one that then takes the GIL aborts the process; see
# harness.launch.groups.end_rank). Both ranks share torchrun's stdout: one os.write per line keeps their lines whole.
EXIT_PROBE = """
import atexit, os, runpy
from harness.launch.groups import gloo_threads
atexit.register(lambda: os.write(1, f"rank {os.environ['RANK']} Gloo threads at exit: {gloo_threads()}\\n".encode()))
runpy.run_module("harness", run_name="__main__", alter_sys=True)
"""


def test_same_code_runs_under_torchrun_and_its_ranks_end_their_groups(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    (tmp_path / "probe.py").write_text(EXIT_PROBE)
    cmd = [
        str(torchrun),
        "--nproc_per_node=2",
        "--master_port",
        str(find_free_port()),
        str(tmp_path / "probe.py"),
        "train",
        "--model=small",
        "--impl=torch",
        "--world_size=2",
        "--iters=2",
        "--warmup=1",
        "--threads_per_rank=1",
        "--timeout_s=60",
        f"--root={tmp_path}",
        "--experiment=torchrun",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from harness.results import load_results

    df = load_results("torchrun", root=tmp_path)
    assert sorted(zip(df["rank"], df["iteration"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (df["error"] == "").all() and (df["world_size"] == 2).all()
    ends = sorted(re.findall(r"rank \d Gloo threads at exit: \[.*?\]", proc.stdout))
    assert ends == [f"rank {r} Gloo threads at exit: []" for r in range(2)], proc.stdout[-2000:] + proc.stderr[-2000:]


def _refaults(ctx):
    """Pages faulted in over the last 6 of 10 cycles of allocating and filling a 256 MiB tensor, each freed
    before the next (the heap grows in the first cycles)."""
    for _ in range(4):
        torch.ones(64 * 2**20).sum()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        torch.ones(64 * 2**20).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_malloc_retain_keeps_freed_memory_in_the_process():
    """What malloc="retain" claims: with glibc's defaults a big block's pages are faulted in again on every reuse
    (6 blocks' worth); kept, they are reused (the heap may still grow once or twice while it fragments)."""
    block = 256 * 2**20 // 4096
    default = launch(_refaults, 2, "gloo", timeout_s=60, threads=1)
    retain = launch(_refaults, 2, "gloo", timeout_s=60, threads=1, rank_env=MALLOC_ENV["retain"])
    assert min(default) > 5 * block and max(retain) < 3 * block, (default, retain)
    assert "MALLOC_MMAP_MAX_" not in os.environ  # set for the spawned ranks only


def test_the_root_cause_is_a_dead_rank_then_the_first_to_report_and_no_rank_for_a_deadline():
    reset = "RuntimeError: Connection reset by peer"
    assert root_cause({0: f"Traceback ...\n{reset}"}, {1: -9}) == (1, "killed by SIGKILL")
    assert root_cause({1: "ValueError: bad input", 0: reset}, {}) == (1, "ValueError: bad input")
    assert root_cause(
        {0: "rank 0 still running after the 60 s deadline", 1: "rank 1 still running after the 60 s deadline"},
        {},
        stuck=[0, 1],
    ) == (None, "rank(s) [0, 1] still running after the 60 s deadline")
