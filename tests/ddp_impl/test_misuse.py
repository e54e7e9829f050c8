"""Misuse gets a clear error within bounded time, never a hang or a silently wrong gradient."""

import pytest
import torch

from ddp_impl import DistributedDataParallel
from ddp_impl.construction import check_devices
from harness.launch.spawn import LaunchError, launch
from tests.ddp_impl import workers


def test_no_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kwargs", [dict(bucket_cap_mb=-1), dict(first_bucket_cap_mb=-0.5)])
def test_negative_bucket_caps(kwargs):
    with pytest.raises(ValueError, match="bucket caps must be finite and >= 0"):
        DistributedDataParallel(torch.nn.Linear(2, 2), **kwargs)


def test_unknown_comm_hook():
    with pytest.raises(ValueError, match="unknown comm_hook 'int4'"):
        DistributedDataParallel(torch.nn.Linear(2, 2), comm_hook="int4")


def test_unknown_timing_mode():
    with pytest.raises(ValueError, match="timing must be True, False or 'trace', got 'always'"):
        DistributedDataParallel(torch.nn.Linear(2, 2), timing="always")


def test_nccl_with_cpu_tensors():
    with pytest.raises(ValueError, match="NCCL backend needs CUDA tensors, but parameter weight is on cpu"):
        check_devices(torch.nn.Linear(2, 2), "nccl")


def test_parameter_without_gradient_is_named_at_next_forward():
    with pytest.raises(LaunchError) as err:
        launch(workers.missing_gradient, 2, "gloo", timeout_s=30, deadline_s=90)
    assert "RuntimeError" in str(err.value)
    assert "never.weight (index 4), never.bias (index 5)" in str(err.value)
    assert "find_unused_parameters=True" in str(err.value)


def test_different_models_on_different_ranks():
    with pytest.raises(LaunchError) as err:
        launch(workers.mismatched_models, 2, "gloo", timeout_s=30, deadline_s=90)
    assert "parameter mismatch at position 0: rank 0 has weight (4, 4) torch.float32, rank 1 has weight (5, 4)" in str(
        err.value
    )


def test_join_on_an_unlearnt_static_graph_is_refused_then_runs():
    for refused in launch(workers.static_graph_join, 2, "gloo", timeout_s=30, deadline_s=90):
        assert "needs one synchronized iteration on every rank" in refused


def test_a_dropped_ddp_is_freed():
    """Sweeps build many DDPs in one process (the harness's rank pools): each must go when dropped."""
    (freed,) = launch(workers.freed_after_use, 1, "gloo", timeout_s=30, deadline_s=60)
    assert freed == [3, 3]
