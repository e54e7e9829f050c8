"""The NCCL/CUDA path, on one GPU per rank; skipped on machines with fewer than 2 GPUs."""

import pytest
import torch

from experiments import parity
from harness.launch.spawn import launch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA GPUs for NCCL")


def check(errors):
    """float64 cases equal to torch's; the fp16 hook close to torch's own fp16 hook."""
    assert set(errors) >= {
        "no_sync accum=3 float64",
        "find_unused view float64",
        "fp16 hook float32",
        "reordered (rebuild) float32",
    }
    bad = {name: err for name, err in errors.items() if err > (5e-3 if "fp16" in name else 1e-6)}
    assert not bad, bad


def _on_own_gpu(ctx):
    return parity.device_matrix(ctx, str(ctx.device))


def test_equal_to_torch_ddp_on_nccl():
    for errors in launch(_on_own_gpu, 2, "nccl", timeout_s=60, deadline_s=300):
        check(errors)
