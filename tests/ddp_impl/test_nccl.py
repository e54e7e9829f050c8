"""The NCCL/CUDA path, on one GPU per rank; skipped on machines with fewer than 2 GPUs."""
import pytest
import torch

from tests.ddp_impl import workers
from tests.spawn import run_ranks

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA GPUs for NCCL")


def test_equal_to_torch_ddp_on_nccl():
    for errors in run_ranks(workers.nccl_matrix, 2, backend="nccl"):
        assert all(err < 1e-5 for err in errors.values()), errors
