"""`make bench` in a tiny configuration: the CLI runs, writes tidy CSVs and prints the tables (no time limits)."""

import math
import os
import subprocess
import sys
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.tools import bench
from experiments.tools.bench import MEMORY_COLUMNS, SUMMARY_COLUMNS, BenchConfig, pooled, validate_bench

FINITE_SUMMARY = (  # every one a positive, finite number at each cap
    "ours_ms",
    "torch_ms",
    "ours_notiming_ms",
    "ideal_ms_ours",
    "ideal_ms_torch",
    "local_backward_ms",
    "allreduce_ms",
    "ratio",
    "ratio_p10",
    "ratio_p90",
    "ratio_ci_lo",
    "ratio_ci_hi",
    "paired_ratio",
    "cpu_ratio",
    "ours_vs_ideal",
    "torch_vs_ideal",
    "torch_b_ms",
    "aa_ratio",
    "ratio_both",
    "paired_both",
)


def _run_tiny_bench(out) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "experiments.tools.bench",
        "--models=small",
        "--bucket_caps_mb=1,25",
        "--iters=3",
        "--warmup=2",
        "--memory_iters=1",
        "--threads_per_rank=1",
        "--timeout_s=60",
        f"--out={out}",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def _check_summary(out) -> None:
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["bucket_cap_mb"]) == [1.0, 25.0] and set(summary["model"]) == {"small"}
    assert set(SUMMARY_COLUMNS) <= set(summary.columns)
    for col in FINITE_SUMMARY:
        assert all(math.isfinite(v) and v > 0 for v in summary[col]), col
    assert (summary["ratio_ci_lo"] <= summary["ratio_ci_hi"]).all()
    assert (summary["rounds"] == 3).all() and summary["same_buckets"].all() and (summary["malloc"] == "default").all()
    assert (summary[["faults_ours", "faults_torch", "faults_torch_b"]] >= 0).all().all()
    assert {"hostname", "cpu", "cores", "torch_version", "git_commit", "backend", "load_before"} <= set(summary)

    assert (summary["paired_both_ci_lo"] <= summary["paired_both"]).all()
    assert (summary["paired_both"] <= summary["paired_both_ci_hi"]).all()


def _check_pooled_and_samples(out) -> None:
    pool = pd.read_csv(out / "pooled.csv")
    assert list(pool["comparison"]) == ["ours / torch, torch_b", "ours_notiming / torch, torch_b", "torch_b / torch"]
    assert (pool["points"] == 2).all() and (pool["rounds"] == 6).all()
    assert ((pool["ci_lo"] <= pool["pooled_ratio"]) & (pool["pooled_ratio"] <= pool["ci_hi"])).all()

    samples = pd.read_csv(out / "latency_samples.csv")
    counts = samples.groupby(["bucket_cap_mb", "variant"]).size()
    assert set(samples["variant"]) == {"torch", "ours", "ours_notiming", "torch_b", "local", "allreduce"}
    trained = samples[samples["variant"] != "allreduce"]
    assert (trained["sys_ms"] >= 0).all() and (trained["sys_ms"] <= trained["cpu_ms"] + 1e-6).all()
    assert (counts == 2 * 3).all()  # 2 ranks x 3 rounds, every variant, every cap


def _check_memory(out) -> None:
    memory = pd.read_csv(out / "memory.csv")
    assert set(MEMORY_COLUMNS) <= set(memory.columns)
    assert sorted(zip(memory["variant"], memory["gradient_as_bucket_view"])) == [
        ("local", False),
        ("ours", False),
        ("ours", True),
        ("torch", False),
        ("torch", True),
    ]
    assert (memory["peak_mb"] >= 0).all() and (memory["param_mb"] > 0).all()


def test_bench_cli_tiny(tmp_path):
    out = tmp_path / "bench"
    proc = _run_tiny_bench(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_summary(out)
    _check_pooled_and_samples(out)
    _check_memory(out)
    for header in ("ours_ms", "torch_ms", "ratio", "ours_vs_ideal", "pooled_ratio", "peak_mb"):
        assert header in proc.stdout


def _samples(ratios: dict[float, float], rounds: int, seed: int = 0) -> pd.DataFrame:
    """Two ranks' latencies per round: torch and torch_b equal, ours = ratio x torch (per cap), all scaled by a
    per-round factor as load swings scale every variant of a round."""
    rng = np.random.default_rng(seed)
    rows = []
    for cap, ratio in ratios.items():
        for rnd in range(rounds):
            load = rng.uniform(0.7, 1.5)
            for rank in (0, 1):
                base = 100.0 * load * (1 + 0.01 * rank)
                for variant, ms in (
                    ("torch", base),
                    ("torch_b", base),
                    ("ours", base * ratio),
                    ("ours_notiming", base * ratio),
                ):
                    rows.append(dict(model="m", bucket_cap_mb=cap, variant=variant, round=rnd, rank=rank, total_ms=ms))
    return pd.DataFrame(rows)


def test_pooled_ratio_is_the_geometric_mean_of_the_paired_point_ratios():
    """Paired per round, so the load swings cancel; pooled over caps geometrically (1.1 and 1/1.1 give 1)."""
    pool = pooled(_samples({1.0: 1.05, 25.0: 1.05}, rounds=15)).set_index("comparison")
    assert pool.loc["ours / torch, torch_b", "pooled_ratio"] == pytest.approx(1.05)
    assert pool.loc["ours / torch, torch_b", "ci_lo"] == pytest.approx(1.05)  # no noise left once paired
    assert pool.loc["torch_b / torch", "pooled_ratio"] == pytest.approx(1.0)
    assert pool.loc["ours / torch, torch_b", "rounds"] == 30
    even = pooled(_samples({1.0: 1.1, 5.0: 1 / 1.1}, rounds=9)).set_index("comparison")
    assert even.loc["ours / torch, torch_b", "pooled_ratio"] == pytest.approx(1.0)
    assert even.loc["ours / torch, torch_b", "ci_lo"] == pytest.approx(1.0)


def test_bench_config_is_validated():
    with pytest.raises(ValueError, match=r"unknown model 'nope'; choose one of \['small'"):
        validate_bench(BenchConfig(models=("nope",)))
    with pytest.raises(ValueError, match="warmup must be >= 2"):
        validate_bench(BenchConfig(warmup=1))  # both DDPs rebuild their buckets after the first iteration
    with pytest.raises(ValueError, match="bucket_caps_mb"):
        validate_bench(BenchConfig(bucket_caps_mb=(25.0, -1.0)))
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        validate_bench(BenchConfig(backend="tpu"))
    with pytest.raises(ValueError, match="malloc"):
        validate_bench(BenchConfig(malloc="jemalloc"))
    with mock.patch.dict(os.environ, {"RANK": "0"}), pytest.raises(ValueError, match="export MALLOC_MMAP_MAX_=0"):
        validate_bench(BenchConfig(malloc="retain"))  # under torchrun the ranks' allocator is already set up
    cfg = validate_bench(BenchConfig())
    assert cfg.profile != "auto" and cfg.backend != "auto"
    assert cfg.world_size == (torch.cuda.device_count() if cfg.backend == "nccl" else 2)  # 0: the machine's
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        validate_bench(BenchConfig(world_size=-1))


def test_bench_at_world_size_one_on_the_host_bound_model(tmp_path):
    """One rank (one GPU's case) runs every variant; tiny-layers' 800 parameters all reach the buckets."""
    out = tmp_path / "bench"
    assert (
        bench.main(
            [
                "--models=tiny-layers",
                "--bucket_caps_mb=0,25",
                "--world_size=1",
                "--iters=3",
                "--memory=false",
                "--timeout_s=60",
                f"--out={out}",
            ]
        )
        == 0
    )
    summary = pd.read_csv(out / "summary.csv")
    assert (summary["world_size"] == 1).all() and summary["same_buckets"].all()
    assert list(summary["num_params"]) == [400 * (16 * 16 + 16)] * 2
    assert summary["ours_buckets"].iloc[0] == 800 and summary["ours_buckets"].iloc[1] == 1
    samples = pd.read_csv(out / "latency_samples.csv")
    assert (samples.groupby(["bucket_cap_mb", "variant"]).size() == 3).all()
