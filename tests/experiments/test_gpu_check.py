"""`make gpu-check` on a machine without CUDA: one line and exit 0; its steps rehearsed on CPU Gloo ranks."""

import os
import subprocess
import sys

import pytest

from experiments.tools import gpu_check
from experiments.tools.gpu_check import GpuCheckConfig


def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.tools.gpu_check"],
        capture_output=True,
        text=True,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "python -m experiments gpu-check: no CUDA GPU here (torch.cuda.is_available() is False): nothing to check"
    ]


def test_plan_uses_nccl_over_every_gpu_and_gloo_sharing_a_single_one(monkeypatch):
    for gpus, parity in ((1, ("gloo", 2)), (4, ("nccl", 4))):
        monkeypatch.setattr(gpu_check.env, "cuda_devices", lambda gpus=gpus: gpus)
        p = gpu_check.plan(GpuCheckConfig())
        assert (p["backend"], p["world_size"], p["profile"]) == ("nccl", gpus, "paper")
        assert (p["parity_backend"], p["parity_world_size"]) == parity
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cpu'"):
        gpu_check.plan(GpuCheckConfig(device="tpu"))


@pytest.mark.timeout(600)
def test_every_step_runs_and_lands_in_the_summary_on_cpu(tmp_path):
    cfg = GpuCheckConfig(
        device="cpu", models=("small",), bucket_caps_mb=(25.0,), bench_iters=2, fig7_iters=1, out=str(tmp_path)
    )
    assert gpu_check.run(cfg) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# gpu-check: CPU (a rehearsal: not a GPU result)")
    assert "**all equal within bounds**" in text and text.count("float64 | 0.00e+00 |") == 6
    assert "| small | 25 |" in text and "| small | ours / torch, torch_b |" in text  # the bench row and pool
    assert "| small 25 |" in text  # fig7's point
    predicted = [line for line in text.splitlines() if line.startswith("| small | 25 | ") and "%" in line]
    assert len(predicted) == 1 and "failed" not in predicted[0]
    assert (tmp_path / "bench" / "summary.csv").exists() and (tmp_path / "results").is_dir()
    assert "| small | 25 25 25 | 3 |" in text  # autotune: nothing to tune in a model smaller than every cap


def test_a_failing_step_is_recorded_and_the_steps_after_it_still_run(tmp_path, monkeypatch):
    """A machine is lent for minutes: the summary is written after each step; a step that raises loses only its own."""
    seen = {}

    def fig7_smoke(cfg, p, out):
        seen["summary before fig7"] = (out / "summary.md").read_text()
        return dict(median_ms={"small 25": 10.0}, forward_ms={"small 25": 2.0})

    def predict_beside(cfg, p, out, measured):
        seen["measured"] = measured
        return [dict(model="small", cap=25.0, predicted_ms=11.0, host_ms=1.0, measured_ms=10.0, error_pct=10.0)]

    def run_bench(bench_cfg):
        raise RuntimeError("the bench refused\nworld_size must be >= 2")

    monkeypatch.setattr(gpu_check, "check_parity", lambda cfg, p: dict(worst={"a": 0.0}, bound={"a": 1e-6}, failed=[]))
    monkeypatch.setattr(gpu_check, "run_bench", run_bench)
    monkeypatch.setattr(gpu_check, "fig7_smoke", fig7_smoke)
    monkeypatch.setattr(gpu_check, "predict_beside", predict_beside)
    cfg = GpuCheckConfig(device="cpu", models=("small",), bucket_caps_mb=(25.0,), out=str(tmp_path))
    assert gpu_check.run(cfg) == 1
    before = seen["summary before fig7"]
    assert "**failed**: RuntimeError: world_size must be >= 2" in before and "**all equal within bounds**" in before
    assert before.split("## 3.")[1].split("## 4.")[0].strip().endswith("(not reached)")
    assert seen["measured"] == {"small 25": 10.0}
    text = (tmp_path / "summary.md").read_text()
    assert "| small 25 | 10.0 | 2.0 |" in text and "| small | 25 | 11.0 | 1.0 | 10.0 | +10.0% |" in text
    assert "(not reached)" not in text


def test_steps_runs_only_the_steps_named_and_refuses_unknown_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "check_parity", lambda cfg, p: pytest.fail("parity was not asked for"))
    monkeypatch.setattr(gpu_check, "run_bench", lambda bench_cfg: pytest.fail("the bench was not asked for"))
    monkeypatch.setattr(gpu_check, "fig7_smoke", lambda cfg, p, out: dict(median_ms={}, forward_ms={}))
    cfg = GpuCheckConfig(device="cpu", models=("small",), steps=("fig7",), out=str(tmp_path))
    assert gpu_check.run(cfg) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.count("(not run: not in --steps)") == 4
    with pytest.raises(ValueError, match="steps must be a non-empty subset of parity,bench,fig7,predict,autotune"):
        gpu_check.plan(GpuCheckConfig(steps=("fig7", "bnech")))
