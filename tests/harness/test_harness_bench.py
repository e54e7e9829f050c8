"""`make bench` in a tiny configuration: the CLI runs, writes tidy CSVs and prints the tables (no time limits)."""
import math
import subprocess
import sys

import pandas as pd
import pytest

from harness.bench import MEMORY_COLUMNS, SUMMARY_COLUMNS, BenchConfig, validate_bench


def test_bench_cli_tiny(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "harness.bench", "--models=small", "--caps=1,25", "--iters=3", "--warmup=2",
           "--memory_iters=1", "--threads_per_rank=1", "--timeout_s=60", f"--out={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]

    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["bucket_cap_mb"]) == [1.0, 25.0] and set(summary["model"]) == {"small"}
    assert set(SUMMARY_COLUMNS) <= set(summary.columns)
    for col in ("ours_ms", "torch_ms", "ours_notiming_ms", "ideal_ms_ours", "ideal_ms_torch", "local_backward_ms",
                "allreduce_ms", "ratio", "ratio_p10", "ratio_p90", "ratio_ci_lo", "ratio_ci_hi", "paired_ratio",
                "cpu_ratio", "ours_vs_ideal", "torch_vs_ideal", "torch_b_ms", "aa_ratio", "ratio_both"):
        assert all(math.isfinite(v) and v > 0 for v in summary[col]), col
    assert (summary["ratio_ci_lo"] <= summary["ratio_ci_hi"]).all()
    assert (summary["rounds"] == 3).all() and summary["same_buckets"].all()
    assert {"hostname", "cpu", "cores", "torch_version", "git_commit", "backend", "load_before"} <= set(summary)

    samples = pd.read_csv(out / "latency_samples.csv")
    counts = samples.groupby(["bucket_cap_mb", "variant"]).size()
    assert set(samples["variant"]) == {"torch", "ours", "ours_notiming", "torch_b", "local", "allreduce"}
    assert (counts == 2 * 3).all()  # 2 ranks x 3 rounds, every variant, every cap

    memory = pd.read_csv(out / "memory.csv")
    assert set(MEMORY_COLUMNS) <= set(memory.columns)
    assert sorted(zip(memory["variant"], memory["gradient_as_bucket_view"])) == [
        ("local", False), ("ours", False), ("ours", True), ("torch", False), ("torch", True)]
    assert (memory["peak_mb"] >= 0).all() and (memory["param_mb"] > 0).all()

    for header in ("ours_ms", "torch_ms", "ratio", "ours_vs_ideal", "peak_mb"):
        assert header in proc.stdout


def test_bench_config_is_validated():
    with pytest.raises(ValueError):
        validate_bench(BenchConfig(models=("nope",)))
    with pytest.raises(ValueError):
        validate_bench(BenchConfig(warmup=1))  # both DDPs rebuild their buckets after the first iteration
    cfg = validate_bench(BenchConfig())
    assert cfg.profile != "auto" and cfg.backend != "auto"
