"""DDPOptions is DistributedDataParallel's settings whole: the same names and defaults as the constructor, so a
caller that builds one from its own configuration passes every setting and restates no default."""

import dataclasses
import inspect

from ddp_impl import DEFAULT_BUCKET_CAP_MB, DDPOptions, DistributedDataParallel
from harness.config import TrainConfig


def test_options_are_the_constructors_settings_with_its_defaults():
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    settings = {n: p.default for n, p in params.items() if n not in ("self", "module", "process_group")}
    assert DDPOptions().kwargs() == settings


def test_a_points_options_carry_its_settings_and_ddp_impls_default_cap():
    cfg = TrainConfig(
        bucket_cap_mb=5.0, overlap=False, gradient_as_bucket_view=True, comm_hook="fp16", trace_buckets=True
    )
    options = cfg.ddp_options()
    assert (
        options.bucket_cap_mb,
        options.overlap,
        options.gradient_as_bucket_view,
        options.comm_hook,
        options.timing,
    ) == (5.0, False, True, "fp16", "trace")
    assert TrainConfig().bucket_cap_mb == DEFAULT_BUCKET_CAP_MB
    assert dataclasses.replace(options, timing=True).kwargs()["timing"] is True
