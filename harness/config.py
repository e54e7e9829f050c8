"""Point configurations (dataclasses), their validation and stable ids (their command line: harness.cli).

A *point* is one fully specified measurement: one launch of ``world_size`` ranks. Drivers build lists of
points and hand them to :func:`harness.sweep.run_sweep`. Each field declares what it accepts (``choices``,
``positive``, ``non_negative`` in its metadata) and :func:`validate` checks every field from that, the one
place a value is checked; what the *machine* must provide (GPUs, namespaces, data on disk) is
:func:`harness.preflight.preflight`'s, run once per sweep. Either raises ValueError naming the field, the
value and what is allowed, before anything is spawned.

``profile="auto"`` and ``backend="auto"`` are resolved (:func:`resolve`) before a point is hashed, so a point
id always names concrete settings: the same config on a GPU and a CPU machine gets different ids.
``net="auto"`` becomes ``loopback`` where no network is emulated (NCCL or a GPU, torchrun, one rank, no
communication, convergence points); elsewhere it stays ``auto`` in the id (the rate is measured at run time
and stored in ``net_rate_mbit``, see :mod:`harness.netem.shaping`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from dataclasses import dataclass, field

from ddp_impl.autotune import AUTO
from ddp_impl.comm_hooks import ALIASES
from ddp_impl.options import DEFAULT_BUCKET_CAP_MB, DDPOptions
from harness.launch import env
from harness.launch.allocator import MALLOC_ENV
from harness.launch.backends import BACKENDS
from harness.netem.rate import check_net
from harness.train_checks import check_train, prior_caps
from harness.workloads.data import DATASETS
from harness.workloads.systems import IMPLS, OPTIMIZERS

MODELS = ("small", "resnet50", "resnet101", "bert-base", "bert-large", "tiny-layers")
PROFILES = ("paper", "cpu")
COMM_HOOKS = ("", *ALIASES)  # ddp_impl's short names of torch's own hooks; "" = the default allreduce
FAULT_KINDS = ("raise", "exit", "segv", "hang", "kill", "linkdown")  # harness.launch.faults.inject_fault
DEFAULT_NET = "auto"  # emulate a link where nothing real is there (spawned CPU ranks); see harness.netem.shaping


def _field(default, check: str = "", choices: tuple = (), identity: bool = True, added: bool = False):
    """A field with what it accepts in its metadata: ``check`` is "positive" or "non_negative". ``identity=False``:
    does not change what is measured, so it is left out of the point id; ``added``: a field added after results
    were stored, left out of the id at its default so those points keep their ids."""
    meta = {"check": check, "choices": choices, "identity": identity, "added": added}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """One training-iteration measurement (paper Figures 6-12)."""

    # the model trained: small | resnet50 | resnet101 | bert-base | bert-large | tiny-layers (harness.workloads.models)
    model: str = _field("small", choices=MODELS)
    impl: str = _field(
        "ours", choices=IMPLS
    )  # ours | torch | local (no DDP) | zero1 | fsdp ...: harness.workloads.systems
    profile: str = _field("auto", choices=("auto", *PROFILES))  # input sizes: paper | cpu | auto (cpu without a GPU)
    backend: str = _field("auto", choices=("auto", *BACKENDS))  # gloo | nccl | mpi | auto (nccl where CUDA is)
    world_size: int = _field(2, "positive")  # ranks (processes), one model replica each
    batch_size: int = _field(0, "non_negative")  # inputs per rank and iteration; 0 = the profile's default
    # DDP bucket cap (MiB), or auto: ours finds it while training (ddp_impl.autotune), unmeasured, before the warmup;
    # ignored by impl=local
    bucket_cap_mb: float | str = _field(float(DEFAULT_BUCKET_CAP_MB), "cap")
    # with bucket_cap_mb=auto: caps in MiB ordered by predicted latency, best first, e.g. "5,10" (the simulator's
    # prior: its first two are raced against the default); "" = a coarse-to-fine search
    autotune_prior_mb: str = _field("", added=True)
    overlap: bool = True  # ours only: launch bucket allreduces during backward (torch always overlaps)
    sync_every: int = _field(1, "positive")  # n: synchronize on 1 of every n iterations (no_sync on the others)
    round_robin_groups: int = _field(1, "positive")  # ours only: k process groups used round-robin
    comm_hook: str = _field("", choices=COMM_HOOKS)  # torch's DDP comm hook: fp16 | bf16 | allreduce; "" = none
    gradient_as_bucket_view: bool = False  # ours and torch: each .grad a view into its bucket (no copy back)
    iters: int = _field(20, "positive")  # measured iterations (rows per rank)
    warmup: int = _field(5, "non_negative")  # iterations run before measuring, never stored
    seed: int = 0  # the model's initial weights and each rank's inputs
    repeat: int = _field(0, "non_negative", added=True)  # which repetition of the point (again, same seed)
    trace_buckets: bool = _field(False, added=True)  # ours only: per-bucket ready and true completion times
    lr: float = 0.01  # the optimizer's learning rate
    optimizer: str = _field("sgd", choices=tuple(OPTIMIZERS), added=True)  # sgd | adam (torch's), for every impl
    checkpointing: bool = _field(False, added=True)  # activation checkpointing per block (harness.workloads.systems)
    memory: bool = _field(False, added=True)  # also one iteration measuring peak memory, one profiling it by category
    replicas: int = _field(1, "positive", added=True)  # impl=threads: model replicas in the one process
    threads_per_rank: int = _field(0, "non_negative")  # torch's threads per rank; 0 = max(1, cores // ranks here)
    net: str = DEFAULT_NET  # loopback | RATE per rank, e.g. 1gbit (emulated link) | auto; see harness.netem.shaping
    hosts: int = _field(1, "positive", added=True)  # emulated hosts: ranks split evenly, net = each host's link
    # glibc's allocator in the ranks: default | retain (freed memory kept for reuse, as CUDA's caching allocator does)
    malloc: str = _field("default", choices=tuple(MALLOC_ENV), added=True)
    timeout_s: float = _field(300.0, "positive", identity=False)  # process group timeout, seconds
    # for tests: "<kind>@<rank>" injects a fault, kind raise | exit | segv | hang | kill | linkdown; "" = none
    fault: str = ""

    def ddp_options(self) -> DDPOptions:
        """This point's DDP settings as the one object :func:`harness.workloads.systems.wrap` hands to a DDP."""
        return DDPOptions(
            bucket_cap_mb=self.bucket_cap_mb,
            overlap=self.overlap,
            comm_hook=self.comm_hook or None,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            timing="trace" if self.trace_buckets else True,
            autotune_prior_mb=prior_caps(self.autotune_prior_mb) or None,
        )


@dataclass(frozen=True)
class AllreduceConfig:
    """Allreduce microbenchmark point (paper Figure 2): total_params float32 split into calls of k params."""

    backend: str = _field("auto", choices=("auto", *BACKENDS))  # gloo | nccl | mpi | auto (nccl where CUDA is)
    world_size: int = _field(2, "positive")  # ranks (processes)
    profile: str = _field("auto", choices=("auto", *PROFILES))  # paper | cpu | auto: total_params' default
    total_params: int = _field(0, "non_negative")  # float32 parameters; 0 = profile default: 60M (paper), 4M (cpu)
    params_per_call: int = _field(1_000_000, "positive")  # k: parameters per allreduce call
    iters: int = _field(10, "positive")  # measured iterations, each allreducing all total_params
    warmup: int = _field(2, "non_negative")  # iterations run before measuring, never stored
    repeat: int = _field(0, "non_negative", added=True)  # which repetition of the point (again, same settings)
    threads_per_rank: int = _field(0, "non_negative")  # torch's threads per rank; 0 = max(1, cores // ranks here)
    net: str = DEFAULT_NET  # loopback | RATE | auto (ResNet50's auto rate); see harness.netem.shaping
    hosts: int = _field(1, "positive", added=True)  # emulated hosts, as TrainConfig's
    timeout_s: float = _field(300.0, "positive", identity=False)  # process group timeout, seconds
    fault: str = ""  # for tests: "<kind>@<rank>", as TrainConfig's; "" = none


@dataclass(frozen=True)
class ConvergenceConfig:
    """Convergence on real data with skipped synchronization (paper Figure 11): loss/accuracy per iteration."""

    dataset: str = _field("digits", choices=DATASETS)  # digits (ships with scikit-learn) | cifar10 (data_dir)
    data_dir: str = ""  # cifar10: directory holding cifar-10-batches-py
    world_size: int = _field(2, "positive")  # ranks (processes)
    backend: str = _field("auto", choices=("auto", *BACKENDS))  # gloo | nccl | mpi | auto (nccl where CUDA is)
    batch_size: int = _field(8, "positive")  # examples per rank and iteration
    sync_every: int = _field(1, "positive")  # n: synchronize on 1 of every n iterations, accumulate otherwise
    iters: int = _field(1600, "positive")  # forward/backward iterations per rank (iters / sync_every steps)
    lr: float = _field(0.02, "positive")  # SGD learning rate (converges on digits at batch 8 and 256, n = 1..8)
    momentum: float = 0.9  # SGD momentum, in [0, 1)
    eval_every: int = _field(40, "positive")  # rank 0 evaluates the test split every eval_every-th iteration
    test_fraction: float = 0.2  # digits: held-out share in (0, 1) (cifar10 uses its official test set)
    seed: int = 0  # model init, train/test split and per-epoch shuffles
    bucket_cap_mb: float = _field(float(DEFAULT_BUCKET_CAP_MB), "non_negative")  # DDP bucket cap (MiB)
    threads_per_rank: int = _field(0, "non_negative")  # torch's threads per rank; 0 = max(1, cores // ranks here)
    net: str = DEFAULT_NET  # loopback | RATE (auto = loopback: convergence is per iteration); see harness.netem.shaping
    timeout_s: float = _field(300.0, "positive", identity=False)  # process group timeout, seconds
    fault: str = ""  # for tests: "<kind>@<rank>", as TrainConfig's; "" = none


PointConfig = typing.Union[TrainConfig, AllreduceConfig, ConvergenceConfig]
POINT_TYPES = (TrainConfig, AllreduceConfig, ConvergenceConfig)

DEFAULT_TOTAL_PARAMS = {"paper": 60_000_000, "cpu": 4_000_000}


def auto_profile_backend(profile: str, backend: str) -> tuple[str, str]:
    """``auto`` profile and backend made concrete for this machine: paper sizes and NCCL where CUDA is."""
    gpu = (profile == "auto" or backend == "auto") and env.cuda_available()
    return (
        ("paper" if gpu else "cpu") if profile == "auto" else profile,
        ("nccl" if gpu else "gloo") if backend == "auto" else backend,
    )


def resolve(cfg: PointConfig) -> PointConfig:
    """Replace ``auto`` profile/backend/net and profile-dependent zeros by concrete values (idempotent)."""
    profile, backend = auto_profile_backend(getattr(cfg, "profile", "cpu"), cfg.backend)
    changes = {"backend": backend}
    if hasattr(cfg, "profile"):
        changes["profile"] = profile
    if cfg.net == "auto" and auto_net_is_loopback(
        type(cfg).__name__, backend, cfg.world_size, getattr(cfg, "impl", "")
    ):
        changes["net"] = "loopback"
    if isinstance(cfg, AllreduceConfig) and cfg.total_params == 0 and profile in DEFAULT_TOTAL_PARAMS:
        changes["total_params"] = DEFAULT_TOTAL_PARAMS[profile]
    return dataclasses.replace(cfg, **changes)


def auto_net_is_loopback(point_type: str, backend: str, world_size: int, impl: str = "") -> bool:
    """Where ``net='auto'`` means plain loopback: it emulates a network only for spawned CPU points that
    communicate and time it; with GPUs (NCCL) or under torchrun the real interconnect is used, and
    convergence does not depend on time. Evaluated where the point runs; the result is stored with its rows
    (``net_auto_loopback``), so plots never ask the plotting machine."""
    return (
        backend == "nccl"
        or env.cuda_available()
        or env.in_place()
        or world_size == 1
        or impl == "local"
        or point_type not in ("TrainConfig", "AllreduceConfig")
    )


def _check_fields(cfg: PointConfig) -> None:
    for f in dataclasses.fields(cfg):
        value, check, choices = getattr(cfg, f.name), f.metadata.get("check"), f.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"unknown {f.name} {value!r}; choose one of {list(choices)}")
        if check == "positive" and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{f.name} must be a positive finite number, got {value}")
        if check == "non_negative" and not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{f.name} must be a finite number >= 0, got {value}")
        if check == "cap" and value != AUTO and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"{f.name} must be a finite number >= 0 or {AUTO!r}, got {value!r}")


def _check_hosts(cfg: PointConfig) -> None:
    """``hosts > 1`` splits the ranks over emulated hosts behind per-host links: it needs an emulated network."""
    hosts = getattr(cfg, "hosts", 1)
    if cfg.fault.startswith("linkdown") and hosts == 1:
        raise ValueError(f"fault {cfg.fault!r} takes an emulated host's link down: it needs hosts > 1")
    if hosts == 1:
        return
    if cfg.world_size % hosts:
        raise ValueError(f"hosts={hosts} must divide world_size={cfg.world_size} (ranks are split evenly)")
    if cfg.net == "loopback":
        raise ValueError(
            f"hosts={hosts} emulates hosts behind their own links, which needs an emulated network: "
            f"net=RATE (each host's link, e.g. 1gbit) or auto, but net is loopback here (auto is "
            f"loopback with GPUs, under torchrun, for 1 rank or impl=local); on real hosts launch "
            f"with torchrun instead"
        )


def _check_fault(fault: str) -> None:
    kind, _, rank = fault.partition("@")
    if fault and (kind not in FAULT_KINDS or not rank.isdigit()):
        raise ValueError(f"bad fault {fault!r}; expected '<{'|'.join(FAULT_KINDS)}>@<rank>'")


def validate(cfg: PointConfig) -> PointConfig:
    """Check every value of ``cfg`` (not the machine: see harness.preflight); raise ValueError naming the first
    bad one. Returns the resolved config."""
    if not isinstance(cfg, POINT_TYPES):
        raise ValueError(f"unknown point config type {type(cfg).__name__}")
    _check_fields(cfg)
    _check_fault(cfg.fault)
    check_net(cfg.net)
    if isinstance(cfg, TrainConfig):
        check_train(cfg)
    elif isinstance(cfg, ConvergenceConfig):
        if not 0 <= cfg.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {cfg.momentum}")
        if not 0 < cfg.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {cfg.test_fraction}")
    cfg = resolve(cfg)
    _check_hosts(cfg)
    if isinstance(cfg, AllreduceConfig) and cfg.params_per_call > cfg.total_params:
        raise ValueError(f"params_per_call={cfg.params_per_call} exceeds total_params={cfg.total_params}")
    return cfg


def point_id(cfg: PointConfig) -> str:
    """Stable 12-hex-digit id of a point: hash of its type and identity fields (after :func:`resolve`); fields
    added later count only away from their default (``repeat=0`` keeps the id a point had before repetitions)."""
    cfg = resolve(cfg)
    ident = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.metadata.get("identity", True) and not (f.metadata.get("added") and getattr(cfg, f.name) == f.default)
    }
    blob = json.dumps({"type": type(cfg).__name__, **ident}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_columns(cfg: PointConfig) -> dict:
    """The config as flat row columns (plus ``point_type``); ``bucket_cap_mb="auto"`` as NaN beside ``autotune``, so
    the column stays numeric."""
    columns = {"point_type": type(cfg).__name__, **dataclasses.asdict(cfg)}
    if columns.get("bucket_cap_mb") == AUTO:
        columns.update(bucket_cap_mb=math.nan, autotune=True)
    return columns
