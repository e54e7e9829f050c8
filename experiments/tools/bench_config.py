"""``make bench``'s settings: what is measured, and the checks made before any rank is spawned."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from harness.config import MODELS, PROFILES, auto_profile_backend
from harness.launch import env
from harness.launch.allocator import MALLOC_ENV, check_malloc_env
from harness.launch.backends import BACKENDS


@dataclass(frozen=True)
class BenchConfig:
    """Our DDP vs torch's DDP: per-iteration latency, ideal bound, instrumentation overhead, peak memory."""

    # the models (harness.workloads.models); tiny-layers, many tiny gradients, measures DDP's host cost
    models: tuple[str, ...] = ("resnet50", "bert-base", "tiny-layers")
    bucket_caps_mb: tuple[float, ...] = (1.0, 5.0, 25.0, 100.0)  # DDP bucket caps (MiB), a point per model each
    # models measured at cap 0 too: a bucket per gradient, where what DDP pays per bucket is the iteration (pooled
    # apart, as "<model>, a bucket per gradient")
    per_gradient_models: tuple[str, ...] = ("tiny-layers",)  # models also measured at cap 0 (a bucket per gradient)
    iters: int = 20  # measured rounds (one iteration of every variant each)
    warmup: int = 3  # rounds before measuring; >= 2 so both DDPs have rebuilt their buckets
    world_size: int = 0  # ranks; 0: torchrun's, else every visible GPU with NCCL (one is enough), else 2
    backend: str = "auto"  # gloo | nccl | auto (nccl with a GPU)
    profile: str = "auto"  # cpu | paper | auto (paper with a GPU); input sizes, see harness.workloads.models
    latency: bool = True  # the interleaved latency points
    memory: bool = True  # peak memory (separate jobs)
    memory_cap_mb: float = float(DEFAULT_BUCKET_CAP_MB)  # the memory jobs' bucket cap (MiB)
    memory_iters: int = 3  # steady-state iterations of each memory job, after the 2 that build the buckets
    threads_per_rank: int = 0  # torch's threads per rank; 0 = cores // ranks
    lr: float = 0.0  # SGD's learning rate; at 0 SGD still does its full update but the weights stay: same work
    seed: int = 0  # the models' initial weights, the inputs and each round's order of variants
    out: str = ""  # output folder; "" = <results>/bench
    timeout_s: float = 600.0  # process group timeout of each job, seconds
    malloc: str = "default"  # glibc's allocator in the ranks: default | retain (freed memory kept), BENCHMARKS.md


def validate_bench(cfg: BenchConfig) -> BenchConfig:
    """Check ``cfg`` before anything is spawned; returns it with ``auto`` profile and backend made concrete."""
    profile, backend = auto_profile_backend(cfg.profile, cfg.backend)
    choices = [("model", m, MODELS) for m in (*cfg.models, *cfg.per_gradient_models)] + [
        ("profile", profile, PROFILES),
        ("backend", backend, BACKENDS),
        ("malloc", cfg.malloc, tuple(MALLOC_ENV)),
    ]
    for name, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}; choose one of {list(allowed)}")
    if not cfg.models or not cfg.bucket_caps_mb or not all(0 <= c < math.inf for c in cfg.bucket_caps_mb):
        raise ValueError(
            f"models and bucket_caps_mb must be non-empty, caps finite and >= 0 MiB; got "
            f"models={cfg.models} bucket_caps_mb={cfg.bucket_caps_mb}"
        )
    if not 0 <= cfg.memory_cap_mb < math.inf:
        raise ValueError(f"memory_cap_mb must be finite and >= 0 MiB, got {cfg.memory_cap_mb}")
    if not (cfg.latency or cfg.memory):
        raise ValueError("latency=false and memory=false: nothing to measure")
    if cfg.threads_per_rank < 0 or not cfg.timeout_s > 0:
        raise ValueError(
            f"threads_per_rank must be >= 0 (0: cores // ranks) and timeout_s > 0, got "
            f"{cfg.threads_per_rank} and {cfg.timeout_s}"
        )
    if cfg.world_size == 0:
        cfg = dataclasses.replace(cfg, world_size=env.default_world_size(backend))
    for name, low, why in (
        ("iters", 1, ""),
        ("warmup", 2, " (both DDPs rebuild their buckets after the first)"),
        ("world_size", 1, ""),
        ("memory_iters", 1, ""),
    ):
        if getattr(cfg, name) < low:
            raise ValueError(f"{name} must be >= {low}{why}, got {getattr(cfg, name)}")
    check_malloc_env(cfg.malloc)
    return dataclasses.replace(cfg, profile=profile, backend=backend)


def caps_of(name: str, cfg: BenchConfig) -> tuple[float, ...]:
    """The caps a model is measured at: ``bucket_caps_mb``, and 0 for ``per_gradient_models``."""
    extra = (0.0,) if name in cfg.per_gradient_models and 0 not in cfg.bucket_caps_mb else ()
    return (*cfg.bucket_caps_mb, *extra)
