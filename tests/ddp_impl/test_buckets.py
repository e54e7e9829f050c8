"""Bucket assignment on real parameter lists (ResNet50, BERT-base), built but never run."""

import pytest
import torch
import torchvision
from transformers import BertConfig, BertForPreTraining

from ddp_impl import ParamSpec, assign_buckets
from ddp_impl.buckets import MIB


def specs_of(model):
    return [ParamSpec.of(n, p) for n, p in model.named_parameters() if p.requires_grad]


@pytest.fixture(scope="module", params=["resnet50", "bert-base"])
def specs(request):
    torch.manual_seed(0)
    if request.param == "resnet50":
        return specs_of(torchvision.models.resnet50(weights=None))
    return specs_of(BertForPreTraining(BertConfig()))


def check_caps(buckets, specs, cap, first_cap):
    for b in buckets:
        limit = first_cap if b.index == 0 else cap
        last = specs[b.param_indices[-1]].nbytes
        assert b.nbytes - last < limit or len(b.param_indices) == 1  # exceeds the cap by at most one tensor
        assert b.nbytes == sum(specs[i].nbytes for i in b.param_indices)
    for b in buckets[:-1]:
        assert b.nbytes >= (first_cap if b.index == 0 else cap)  # only the last bucket closes early


@pytest.mark.parametrize("cap_mb", [1, 5, 25])
def test_reverse_order_caps_and_small_first_bucket(specs, cap_mb):
    buckets = assign_buckets(specs, cap_mb * MIB, 1 * MIB)
    flat_order = [i for b in buckets for i in b.param_indices]
    assert flat_order == list(reversed(range(len(specs))))
    check_caps(buckets, specs, cap_mb * MIB, 1 * MIB)
    assert sum(b.nbytes for b in buckets) == sum(s.nbytes for s in specs)


def test_extremes(specs):
    assert len(assign_buckets(specs, 0, 0)) == len(specs)  # the paper's unbucketed extreme
    assert len(assign_buckets(specs, 10**12, 10**12)) == 1


def test_resnet50_bucket_count_at_default_cap():
    specs = specs_of(torchvision.models.resnet50(weights=None))
    total = sum(s.nbytes for s in specs)
    assert 97 * MIB < total < 98 * MIB  # 25.6M float32 parameters
    buckets = assign_buckets(specs, 25 * MIB, 1 * MIB)
    assert buckets[0].names[0] == "fc.bias" and buckets[-1].names[-1] == "conv1.weight"
    assert len(buckets) == 5  # 1 MiB head, then ~25 MiB buckets over the remaining ~96 MiB


def test_split_by_dtype_and_given_order():
    specs = [
        ParamSpec("a", 10, torch.float32, torch.device("cpu")),
        ParamSpec("b", 10, torch.float16, torch.device("cpu")),
        ParamSpec("c", 10, torch.float32, torch.device("cpu")),
    ]
    buckets = assign_buckets(specs, 10**6, order=[1, 0, 2])
    assert [b.names for b in buckets] == [("b",), ("a", "c")]
    with pytest.raises(ValueError, match="permutation"):
        assign_buckets(specs, 10, order=[0, 0, 1])
