"""The NCCL/CUDA path, on one GPU per rank; skipped on machines with fewer than 2 GPUs."""
import pytest
import torch

from tests.ddp_impl import workers
from harness.launch import launch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA GPUs for NCCL")


def test_equal_to_torch_ddp_on_nccl():
    for errors in launch(workers.nccl_matrix, 2, "nccl", timeout_s=60, deadline_s=300):
        assert all(err < 1e-5 for err in errors.values()), errors
