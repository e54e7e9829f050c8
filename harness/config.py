"""Point configurations (dataclasses), their validation, stable ids and a generic dataclass -> CLI helper.

A *point* is one fully specified measurement: one launch of ``world_size`` ranks. Drivers build lists of
points and hand them to :func:`harness.sweep.run_sweep`. Validation runs before anything is spawned, so a
bad value costs a ValueError naming it, never a hung launch.

``profile="auto"`` and ``backend="auto"`` are resolved (:func:`resolve`) before a point is hashed, so a point
id always names concrete settings: the same config on a GPU and a CPU machine gets different ids.
``net="auto"`` becomes ``loopback`` where no network is emulated (NCCL or a GPU, torchrun, one rank, no
communication, convergence points); elsewhere it stays ``auto`` in the id (the rate is measured at run time
and stored in ``net_rate_mbit``, see :mod:`harness.netem`).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import typing
from dataclasses import dataclass, field

from harness import netem
from harness.env import in_place

MODELS = ("small", "resnet50", "bert-base", "bert-large")
PROFILES = ("paper", "cpu")
IMPLS = ("ours", "torch", "local")
BACKENDS = ("gloo", "nccl")
COMM_HOOKS = ("", "allreduce", "fp16_compress", "bf16_compress")
FAULT_KINDS = ("raise", "exit", "hang")

# Fields marked with this metadata do not change what is measured, so they are left out of the point id.
NOT_IDENTITY = {"identity": False}


@dataclass(frozen=True)
class TrainConfig:
    """One training-iteration measurement (paper Figures 6-12)."""

    model: str = "small"  # one of MODELS
    impl: str = "ours"  # ours | torch (torch's DDP) | local (no DDP, no communication)
    profile: str = "auto"  # paper | cpu | auto (cpu when no GPU); input sizes, see harness.models
    backend: str = "auto"  # gloo | nccl | auto (nccl when CUDA is available)
    world_size: int = 2
    batch_size: int = 0  # per rank; 0 = the profile's default
    bucket_cap_mb: float = 25.0  # DDP bucket cap (MiB); ignored by impl=local
    overlap: bool = True  # ours only: launch bucket allreduces during backward (torch always overlaps)
    sync_every: int = 1  # n: synchronize gradients on 1 of every n iterations (no_sync on the others)
    round_robin_groups: int = 1  # ours only: k process groups used round-robin
    comm_hook: str = ""  # one of COMM_HOOKS; "" = the implementation's default allreduce
    gradient_as_bucket_view: bool = False
    iters: int = 20  # measured iterations (rows per rank)
    warmup: int = 5  # iterations run before measuring, never stored
    seed: int = 0
    lr: float = 0.01  # plain SGD
    threads_per_rank: int = 0  # 0 = max(1, cores // ranks on this node)
    net: str = "loopback"  # loopback | RATE per rank, e.g. 1gbit (emulated link) | auto; see harness.netem
    timeout_s: float = field(default=300.0, metadata=NOT_IDENTITY)  # process group timeout
    fault: str = ""  # fault injection for tests: "<raise|exit|hang>@<rank>"


@dataclass(frozen=True)
class AllreduceConfig:
    """Allreduce microbenchmark point (paper Figure 2): total_params float32 split into calls of k params."""

    backend: str = "auto"
    world_size: int = 2
    profile: str = "auto"
    total_params: int = 0  # 0 = profile default: 60M (paper) or 4M (cpu)
    params_per_call: int = 1_000_000  # k
    iters: int = 10
    warmup: int = 2
    threads_per_rank: int = 0
    net: str = "loopback"  # loopback | RATE | auto (ResNet50's auto rate); see harness.netem
    timeout_s: float = field(default=300.0, metadata=NOT_IDENTITY)
    fault: str = ""


@dataclass(frozen=True)
class ConvergenceConfig:
    """Convergence on real data with skipped synchronization (paper Figure 11): loss/accuracy per iteration."""

    dataset: str = "digits"  # digits (ships with scikit-learn) | cifar10 (read from data_dir, never downloaded)
    data_dir: str = ""  # cifar10: directory holding cifar-10-batches-py
    world_size: int = 2
    backend: str = "auto"
    batch_size: int = 8  # per rank
    sync_every: int = 1  # n: synchronize on 1 of every n iterations, no_sync (accumulate) on the others
    iters: int = 1600  # forward/backward iterations per rank (the optimizer steps iters / sync_every times)
    lr: float = 0.02  # SGD learning rate (converges on digits at batch 8 and 256 for n = 1..8)
    momentum: float = 0.9
    eval_every: int = 40  # rank 0 evaluates the test split after every eval_every-th iteration and the last
    test_fraction: float = 0.2  # digits: held-out share (cifar10 uses its official test set)
    seed: int = 0  # model init, train/test split and per-epoch shuffles
    bucket_cap_mb: float = 25.0
    threads_per_rank: int = 0
    net: str = "loopback"  # loopback | RATE (auto = loopback: convergence is per iteration); see harness.netem
    timeout_s: float = field(default=300.0, metadata=NOT_IDENTITY)
    fault: str = ""


PointConfig = typing.Union[TrainConfig, AllreduceConfig, ConvergenceConfig]

DEFAULT_TOTAL_PARAMS = {"paper": 60_000_000, "cpu": 4_000_000}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(cfg: PointConfig) -> PointConfig:
    """Replace ``auto`` profile/backend and profile-dependent zeros by concrete values."""
    changes = {}
    if getattr(cfg, "profile", None) == "auto":
        changes["profile"] = "paper" if cuda_available() else "cpu"
    if cfg.backend == "auto":
        changes["backend"] = "nccl" if cuda_available() else "gloo"
    if getattr(cfg, "net", "loopback") == "auto" and auto_net_is_loopback(
            type(cfg).__name__, changes.get("backend", cfg.backend), cfg.world_size, getattr(cfg, "impl", "")):
        changes["net"] = "loopback"
    if isinstance(cfg, AllreduceConfig) and cfg.total_params == 0:
        profile = changes.get("profile", cfg.profile)
        if profile in DEFAULT_TOTAL_PARAMS:
            changes["total_params"] = DEFAULT_TOTAL_PARAMS[profile]
    return dataclasses.replace(cfg, **changes) if changes else cfg


def auto_net_is_loopback(point_type: str, backend: str, world_size: int, impl: str = "") -> bool:
    """Where ``net='auto'`` means plain loopback: it emulates a network only for spawned CPU points that
    communicate and time it; with GPUs (NCCL) or under torchrun the real interconnect is used, and
    convergence does not depend on time."""
    return (backend == "nccl" or cuda_available() or in_place() or world_size == 1 or impl == "local"
            or point_type not in ("TrainConfig", "AllreduceConfig"))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {list(choices)}")


def _check_fault(fault: str) -> None:
    if not fault:
        return
    kind, _, rank = fault.partition("@")
    if kind not in FAULT_KINDS or not rank.isdigit():
        raise ValueError(f"bad fault {fault!r}; expected '<{'|'.join(FAULT_KINDS)}>@<rank>'")


def ranks_on_this_node(world_size: int) -> int:
    """Ranks sharing this machine: LOCAL_WORLD_SIZE under torchrun, else all of them (spawned)."""
    if in_place() and "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return world_size


def validate(cfg: PointConfig) -> PointConfig:
    """Resolve and check ``cfg``; raise ValueError naming the first bad value. Returns the resolved config."""
    if not isinstance(cfg, (TrainConfig, AllreduceConfig, ConvergenceConfig)):
        raise ValueError(f"unknown point config type {type(cfg).__name__}")
    if getattr(cfg, "profile", "auto") != "auto":
        _check_choice("profile", cfg.profile, PROFILES)
    if cfg.backend != "auto":
        _check_choice("backend", cfg.backend, BACKENDS)
    if cfg.world_size < 1:
        raise ValueError(f"world_size must be positive, got {cfg.world_size}")
    if cfg.iters <= 0:
        raise ValueError(f"iters must be positive, got {cfg.iters}")
    if getattr(cfg, "warmup", 0) < 0:
        raise ValueError(f"warmup must be non-negative, got {cfg.warmup}")
    if cfg.timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {cfg.timeout_s}")
    if cfg.threads_per_rank < 0:
        raise ValueError(f"threads_per_rank must be >= 0, got {cfg.threads_per_rank}")
    _check_fault(cfg.fault)
    netem.check_net(cfg.net)
    if isinstance(cfg, TrainConfig):
        _check_choice("model", cfg.model, MODELS)
        _check_choice("impl", cfg.impl, IMPLS)
        _check_choice("comm_hook", cfg.comm_hook, COMM_HOOKS)
        if cfg.bucket_cap_mb < 0:
            raise ValueError(f"bucket_cap_mb must be >= 0, got {cfg.bucket_cap_mb}")
        if cfg.batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {cfg.batch_size}")
        if cfg.sync_every < 1:
            raise ValueError(f"sync_every must be positive, got {cfg.sync_every}")
        if cfg.round_robin_groups < 1:
            raise ValueError(f"round_robin_groups must be positive, got {cfg.round_robin_groups}")
        if cfg.round_robin_groups > 1 and cfg.impl != "ours":
            raise ValueError(f"round_robin_groups={cfg.round_robin_groups} needs impl='ours', got {cfg.impl!r}")
        if not cfg.overlap and cfg.impl == "torch":
            raise ValueError("overlap=False is only available with impl='ours' (torch's DDP always overlaps)")
        if cfg.comm_hook and cfg.impl == "local":
            raise ValueError(f"comm_hook={cfg.comm_hook!r} needs a DDP impl, got impl='local'")
    elif isinstance(cfg, ConvergenceConfig):
        _validate_convergence(cfg)
    else:
        if cfg.total_params < 0:
            raise ValueError(f"total_params must be >= 0, got {cfg.total_params}")
        if cfg.params_per_call <= 0:
            raise ValueError(f"params_per_call must be positive, got {cfg.params_per_call}")
    cfg = resolve(cfg)
    if isinstance(cfg, AllreduceConfig) and cfg.params_per_call > cfg.total_params:
        raise ValueError(f"params_per_call={cfg.params_per_call} exceeds total_params={cfg.total_params}")
    if cfg.backend == "nccl":
        if not cuda_available():
            raise ValueError("backend='nccl' needs CUDA, but torch.cuda.is_available() is False")
        import torch

        local = ranks_on_this_node(cfg.world_size)
        if local > torch.cuda.device_count():
            raise ValueError(
                f"world_size={cfg.world_size} puts {local} ranks on this node but only "
                f"{torch.cuda.device_count()} GPU(s) are visible; backend='nccl' needs one GPU per rank"
            )
    if cfg.net != "loopback":
        if in_place():
            raise ValueError(f"net={cfg.net!r} cannot apply under torchrun/SLURM (RANK is set): the ranks already "
                             f"run on the real network; use net='loopback'")
        netem.require()  # NetemUnavailable (a ValueError) names what is missing
    return cfg


def _validate_convergence(cfg: ConvergenceConfig) -> None:
    from harness.data import check_dataset  # unknown data set or missing CIFAR-10 directory: before any spawn

    check_dataset(cfg.dataset, cfg.data_dir)
    for name in ("batch_size", "sync_every", "eval_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if not cfg.lr > 0:
        raise ValueError(f"lr must be positive, got {cfg.lr}")
    if not 0 <= cfg.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {cfg.momentum}")
    if not 0 < cfg.test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {cfg.test_fraction}")
    if cfg.bucket_cap_mb < 0:
        raise ValueError(f"bucket_cap_mb must be >= 0, got {cfg.bucket_cap_mb}")


def point_id(cfg: PointConfig) -> str:
    """Stable 12-hex-digit id of a point: hash of its type and identity fields (after :func:`resolve`)."""
    cfg = resolve(cfg)
    ident = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.metadata.get("identity", True)}
    blob = json.dumps({"type": type(cfg).__name__, **ident}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_columns(cfg: PointConfig) -> dict:
    """The config as flat row columns (plus ``point_type``)."""
    return {"point_type": type(cfg).__name__, **dataclasses.asdict(cfg)}


# --------------------------------------------------------------------------- dataclass <-> command line

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _converter(tp):
    """A str -> value function for a field type; lists and tuples are comma-separated."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _converter(args[0])
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (str,)
        conv = _converter(inner)
        seq = list if origin is list else tuple
        return lambda text: seq(conv(x) for x in text.split(",") if x.strip() != "")
    if tp is bool:
        return _parse_bool
    if tp in (int, float, str):
        return tp
    raise TypeError(f"unsupported field type {tp!r} for the command line")


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls) -> argparse.ArgumentParser:
    """Add one ``--name=value`` option per field of dataclass ``cls`` (default: the field's default)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        required = False
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default, required = None, True
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else repr(default)
        tp = hints[f.name]
        metavar = "A,B,..." if typing.get_origin(tp) in (list, tuple) else getattr(tp, "__name__", "VALUE")
        parser.add_argument(f"--{f.name}", type=_converter(tp), default=default, required=required,
                            metavar=metavar, help="required" if required else f"(default: {shown})")
    return parser


def dataclass_from_namespace(cls, ns: argparse.Namespace):
    """Build ``cls`` from the matching attributes of an argparse namespace."""
    return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)})


def parse_dataclass(cls, argv: typing.Sequence[str] | None = None, prog: str | None = None):
    """Parse ``--key=value`` overrides of ``cls``'s defaults; unknown keys are an error."""
    parser = add_dataclass_arguments(argparse.ArgumentParser(prog=prog, description=cls.__doc__), cls)
    return dataclass_from_namespace(cls, parser.parse_args(argv))
