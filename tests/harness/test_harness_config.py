"""Validation before launch, stable point ids, profile resolution and the dataclass command-line helper."""

import dataclasses

import pytest

import harness.config as config
import harness.sweep as sweep
from harness.cli import field_comments, parse_dataclass
from harness.config import AllreduceConfig, TrainConfig, point_id, validate
from harness.launch import env


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("launch must not be reached")

    monkeypatch.setattr(sweep._Pools, "get_for", refuse)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (TrainConfig(model="vgg"), "model 'vgg'"),
        (TrainConfig(profile="tpu"), "profile 'tpu'"),
        (TrainConfig(impl="horovod"), "impl 'horovod'"),
        (TrainConfig(iters=0), "iters must be a positive finite number, got 0"),
        (TrainConfig(warmup=-1), "warmup must be a finite number >= 0, got -1"),
        (TrainConfig(bucket_cap_mb=-1.0), "bucket_cap_mb must be a finite number >= 0 or 'auto', got -1.0"),
        (TrainConfig(bucket_cap_mb="fast"), "bucket_cap_mb must be a finite number >= 0 or 'auto', got 'fast'"),
        (TrainConfig(bucket_cap_mb="auto", impl="torch"), "bucket_cap_mb='auto' is ours's own"),
        (TrainConfig(autotune_prior_mb="5"), "autotune_prior_mb='5' needs bucket_cap_mb='auto'"),
        (TrainConfig(bucket_cap_mb="auto", autotune_prior_mb="5,x"), "autotune_prior_mb='5,x' needs"),
        (TrainConfig(sync_every=0), "sync_every must be a positive finite number, got 0"),
        (TrainConfig(world_size=0), "world_size must be a positive finite number, got 0"),
        (TrainConfig(impl="torch", overlap=False), "overlap=False"),
        (TrainConfig(impl="torch", round_robin_groups=3), "round_robin_groups=3"),
        (TrainConfig(comm_hook="powersgd"), "comm_hook 'powersgd'"),
        (TrainConfig(fault="explode"), "fault 'explode'"),
        (TrainConfig(malloc="jemalloc"), "malloc 'jemalloc'"),
        (TrainConfig(memory=True, malloc="retain"), "malloc='retain' prevents"),
        (AllreduceConfig(iters=-2), "iters must be a positive finite number, got -2"),
        (AllreduceConfig(params_per_call=0), "params_per_call must be a positive finite number, got 0"),
        (AllreduceConfig(total_params=10, params_per_call=100), "params_per_call=100 exceeds total_params=10"),
    ],
)
def test_bad_values_raise_before_anything_is_launched(no_launch, tmp_path, cfg, message):
    good = TrainConfig(world_size=1)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sweep.run_sweep("bad", [good, cfg], root=tmp_path)
    assert not (tmp_path / "bad").exists()


def test_nccl_without_cuda_is_refused(no_launch, monkeypatch, tmp_path):
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    with pytest.raises(ValueError, match="backend='nccl' needs CUDA"):
        sweep.run_sweep("bad", [TrainConfig(backend="nccl")], root=tmp_path)


def test_more_nccl_ranks_than_gpus_is_refused(no_launch, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(env, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="world_size=3 .* only 2 GPU"):
        sweep.run_sweep(
            "bad", [AllreduceConfig(backend="nccl", world_size=3, total_params=10, params_per_call=5)], root=tmp_path
        )


def test_an_allocator_setting_under_torchrun_must_already_be_exported(monkeypatch):
    from harness.preflight import preflight

    monkeypatch.setenv("RANK", "0")  # the ranks are already running: glibc read its settings when they started
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    with pytest.raises(ValueError, match="malloc='retain' under torchrun/SLURM: export MALLOC_MMAP_MAX_=0"):
        preflight([TrainConfig(world_size=1, backend="gloo", net="loopback", malloc="retain")])
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(2**62))
    preflight([TrainConfig(world_size=1, backend="gloo", net="loopback", malloc="retain")])


def test_auto_profile_and_backend_follow_the_hardware(monkeypatch):
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    cpu = validate(TrainConfig())
    assert (cpu.profile, cpu.backend) == ("cpu", "gloo")
    assert validate(AllreduceConfig()).total_params == config.DEFAULT_TOTAL_PARAMS["cpu"]
    assert point_id(TrainConfig()) == point_id(TrainConfig(profile="cpu", backend="gloo"))
    monkeypatch.setattr(env, "cuda_available", lambda: True)
    gpu = config.resolve(TrainConfig())
    assert (gpu.profile, gpu.backend) == ("paper", "nccl")
    assert config.resolve(AllreduceConfig()).total_params == 60_000_000


def test_point_id_is_stable_and_sensitive_to_identity_fields(monkeypatch):
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    base = TrainConfig(model="resnet50", bucket_cap_mb=25.0)
    assert point_id(base) == point_id(TrainConfig(model="resnet50", bucket_cap_mb=25.0))
    assert len(point_id(base)) == 12
    for change in ({"bucket_cap_mb": 5.0}, {"impl": "torch"}, {"seed": 1}, {"sync_every": 2}, {"malloc": "retain"}):
        assert point_id(dataclasses.replace(base, **change)) != point_id(base), change
    assert point_id(dataclasses.replace(base, timeout_s=60.0)) == point_id(base)  # not an identity field
    assert point_id(AllreduceConfig(world_size=2)) != point_id(TrainConfig(world_size=2))


@dataclasses.dataclass
class _DriverConfig:
    bucket_caps_mb: list[float] = dataclasses.field(default_factory=lambda: [1.0, 25.0])
    models: tuple[str, ...] = ("resnet50",)
    quick: bool = False
    name: str = "fig7"


def test_dataclass_cli_overrides():
    cfg = parse_dataclass(
        TrainConfig, ["--model=bert-base", "--overlap=false", "--bucket_cap_mb=5", "--world_size", "3"]
    )
    assert cfg == TrainConfig(model="bert-base", overlap=False, bucket_cap_mb=5.0, world_size=3)
    assert parse_dataclass(TrainConfig, ["--bucket_cap_mb=auto"]).bucket_cap_mb == "auto"
    assert parse_dataclass(TrainConfig, []) == TrainConfig()
    drv = parse_dataclass(_DriverConfig, ["--bucket_caps_mb=0,5,100", "--models=small,bert-base", "--quick=1"])
    assert drv == _DriverConfig(bucket_caps_mb=[0.0, 5.0, 100.0], models=("small", "bert-base"), quick=True)


@pytest.mark.parametrize("argv", [["--overlap=maybe"], ["--no_such_key=1"], ["--iters=ten"]])
def test_dataclass_cli_rejects_bad_input(argv, capsys):
    with pytest.raises(SystemExit):
        parse_dataclass(TrainConfig, argv)
    err = capsys.readouterr().err
    assert "error:" in err and argv[0].split("=")[0] in err


@dataclasses.dataclass(frozen=True)
class _Described:
    caps_mb: tuple[float, ...] = (1.0, 5.0)  # bucket caps (MiB), 100% of them
    # what the line below is,
    # over two lines
    world_size: int = 2
    net: str = dataclasses.field(default="auto", metadata={"help": "from metadata"})

    def ranks(self) -> int:
        # a method's comment describes no field
        return self.world_size


@dataclasses.dataclass(frozen=True)
class _Redeclared(_Described):
    world_size: int = 4
    caps_mb: tuple[float, ...] = (25.0,)  # caps of the subclass


def test_help_takes_each_fields_comment_and_its_default(capsys):
    assert field_comments(_Redeclared) == {
        "caps_mb": "caps of the subclass",
        "world_size": "what the line below is, over two lines",
    }
    with pytest.raises(SystemExit):
        parse_dataclass(_Redeclared, ["--help"], prog="prog")
    out = " ".join(capsys.readouterr().out.split())
    assert "--world_size int what the line below is, over two lines (default: 4)" in out
    assert "--caps_mb A,B,... caps of the subclass (default: 25.0)" in out
    assert "--net str from metadata (default: 'auto')" in out
    with pytest.raises(SystemExit):
        parse_dataclass(_Described, ["--help"], prog="prog")
    assert "100% of them" in capsys.readouterr().out  # a % in a comment is text, not a format
