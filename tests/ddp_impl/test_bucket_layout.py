"""After the rebuild, our buckets hold the same bytes as torch's (same caps, same first-bucket rule), so a
latency comparison of the two launches the same allreduces."""
import pytest
import torch
import torchvision

from harness.launch import launch

CAPS = [None, 1, 5, 25, 100]  # None: the default (25 MiB with a 1 MiB first bucket, in both)


def bucket_bytes(ctx):
    from ddp_impl import DistributedDataParallel as OurDDP

    x = torch.randn(2, 3, 32, 32)
    out = {}
    for cap in CAPS:
        kwargs = {} if cap is None else {"bucket_cap_mb": cap}
        ours, theirs = (wrap(torchvision.models.resnet50(weights=None), **kwargs)
                        for wrap in (OurDDP, torch.nn.parallel.DistributedDataParallel))
        for model in (ours, theirs):
            for _ in range(3):  # both rebuild after the first iteration; torch logs it a step later
                model(x).sum().backward()
        logged = theirs._get_ddp_logging_data()
        assert logged.get("has_rebuilt_buckets") == 1
        out[cap] = ([b["nbytes"] for b in ours.bucket_info()],
                    [int(s) for s in logged["rebuilt_bucket_sizes"].split(",")])
    return out


@pytest.mark.timeout(240)
def test_bucket_sizes_equal_torch_after_rebuild():
    for per_cap in launch(bucket_bytes, 2, "gloo", timeout_s=120, deadline_s=200):
        for cap, (ours, theirs) in per_cap.items():
            assert ours == theirs, f"bucket_cap_mb={cap}"
