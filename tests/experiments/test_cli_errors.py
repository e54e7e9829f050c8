"""Bad input on a command line ends as one ``error:`` line with exit status 2 and no traceback, before any rank
is spawned; everything accepted is a point that runs. Property-based (hypothesis) over every driver's config and
over bucket caps, plus the refusals that only the machine can make (no GPU for NCCL). Each entry point as a user
types it: test_cli_errors_entry_points."""

import dataclasses
import math
import re
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_impl.buckets import mb_to_bytes
from experiments import registry
from experiments.__main__ import main
from experiments.tools import bench
from harness import TrainConfig, preflight, sweep
from harness.cli import parse_dataclass
from harness.config import MODELS
from tests.experiments.cli_refusal import no_rank_spawns, refused_in_one_line, run_cli

DRIVERS = registry.drivers()
CHOICES = {  # values worth trying for fields with a vocabulary: the valid ones and a few that are not
    "models": [*MODELS, "vgg", ""],
    "model": [*MODELS, "vgg"],
    "backends": ["gloo", "nccl", "mpi"],
    "backend": ["auto", "gloo", "nccl", "mpi"],
    "profile": ["auto", "cpu", "paper", "tpu"],
    "impl": ["ours", "torch", "local", "theirs"],
    "net": ["auto", "loopback", "1gbit", "500mbit", "0mbit", "-1gbit", "fast", "10 gbit"],
    "comm_hook": ["", "fp16", "bf16", "allreduce", "int4"],
    "dataset": ["digits", "cifar10", "mnist"],
}
NUMBERS = st.one_of(st.integers(-3, 12).map(str), st.sampled_from(["nan", "inf", "-inf", "0.5", "1e3", "x", ""]))


def _value(name: str, hint) -> st.SearchStrategy[str]:
    origin = typing.get_origin(hint)
    if name in CHOICES:
        one = st.sampled_from(CHOICES[name])
        return st.lists(one, max_size=3).map(",".join) if origin is tuple else one
    if origin is tuple:
        return st.lists(NUMBERS, max_size=4).map(",".join)
    if hint is bool:
        return st.sampled_from(["true", "false", "maybe"])
    if hint in (int, float):
        return NUMBERS
    return st.sampled_from(["", "x", "0"])


@st.composite
def driver_args(draw):
    name = draw(st.sampled_from(sorted(DRIVERS)))
    hints = typing.get_type_hints(DRIVERS[name].Config)
    fields = draw(st.lists(st.sampled_from(sorted(hints)), max_size=3, unique=True))
    return name, [f"--{f}={draw(_value(f, hints[f]))}" for f in fields]


@pytest.fixture(scope="module", autouse=True)
def nothing_spawns(tmp_path_factory):
    with no_rank_spawns(tmp_path_factory):
        yield


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(driver_args())
def test_every_driver_config_dry_runs_or_is_refused_in_one_line(case):
    name, args = case
    code, err = run_cli([name, *args, "--dry-run"])
    if code == 0:
        assert "Traceback" not in err
        driver = DRIVERS[name]
        for point in driver.points(
            parse_dataclass(driver.Config, args)
        ):  # accepted means runnable: caps a DDP takes, finite numbers
            if isinstance(point, TrainConfig):
                mb_to_bytes(point.bucket_cap_mb)
            assert all(math.isfinite(v) for v in dataclasses.asdict(point).values() if isinstance(v, float))
    else:
        assert refused_in_one_line(code, err, f"python -m experiments {name}"), (args, code, err)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3))
def test_bucket_caps_are_accepted_exactly_when_a_ddp_takes_them(caps):
    code, err = run_cli(["fig7", f"--bucket_caps_mb={','.join(map(repr, caps))}", "--dry-run"])
    takes = all(0 <= c < math.inf for c in caps)
    assert (code == 0) == takes, (caps, code, err)
    if not takes:
        assert refused_in_one_line(code, err, "python -m experiments fig7") and "bucket_cap_mb" in err
        with pytest.raises(ValueError, match="bucket caps must be finite and >= 0"):
            for c in caps:
                mb_to_bytes(c)


@pytest.mark.parametrize(
    "argv, prog, message",
    [
        (
            ["fig7", "--backends=nccl", "--models=resnet50"],
            "python -m experiments fig7",
            "backends='nccl': nothing this machine can run: NCCL unavailable here: 0 CUDA GPU(s) for 2 ranks",
        ),
        (["fig9", "--backends=nccl", "--world_sizes=1,2"], "python -m experiments fig9", "NCCL unavailable here"),
        (["fig7", "--models=", "--dry-run"], "python -m experiments fig7", "no point to measure (models is empty)"),
        (["fig07"], "python -m experiments fig07", "did you mean fig7?"),
        (["report", "fig77"], "python -m experiments report", "unknown figure 'fig77'"),
        (["claims", "fig7"], "python -m experiments claims", "unexpected argument 'fig7'"),
        (
            ["fig10", "--iters=6", "--sync_every=1,2,4", "--dry-run"],
            "python -m experiments fig10",
            "iters=6 must be a multiple of every n of sync_every, but not of 4: e.g. iters=8",
        ),
        (["fig99"], "python -m experiments fig99", "unknown figure 'fig99'; choose one of fig2"),
        (["plots", "fig99"], "python -m experiments plots", "unknown figure 'fig99'"),
        (["predict", "--model=vgg"], "python -m experiments predict", "unknown model 'vgg'; choose one of"),
        (["predict", "--backend=nccl"], "python -m experiments predict", "backend='nccl' needs CUDA"),
        # what the simulation does not model is refused, not ignored
        (
            ["predict", "--cluster=paper-v100", "--impl=local"],
            "python -m experiments predict",
            "impl='local': predict models DDP's buckets",
        ),
        (
            ["predict", "--cluster=paper-v100", "--optimizer=adam"],
            "python -m experiments predict",
            "optimizer='adam': predict does not model it",
        ),
    ],
)
def test_refusals_of_the_machine_and_other_commands(argv, prog, message):
    code, err = run_cli(argv)
    if message is None:  # nothing this machine can run: no points, a clean exit
        assert code == 0 and "Traceback" not in err
        return
    assert refused_in_one_line(code, err, prog) and message in err, err


def test_predict_help_shows_the_model_it_predicts_by_default(capsys):
    with pytest.raises(SystemExit) as done:
        main(["predict", "--help"])
    assert done.value.code == 0
    # the field's description, then its default, before the next option
    assert re.search(r"--model str\s+(?:(?!\n  -).)*?\(default: 'resnet50'\)", capsys.readouterr().out, re.S)


def test_bench_refuses_in_one_line(capsys):
    assert bench.main(["--bucket_caps_mb=-1"]) == 2
    assert bench.main(["--backend=nccl"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("python -m experiments bench: error: models and bucket_caps_mb must be non-empty")
    assert lines[1] == (
        "python -m experiments bench: error: backend='nccl' needs CUDA, but torch.cuda.is_available() is False"
    )


def test_a_sweep_some_of_whose_backends_run_goes_on_and_says_which_it_left_out():
    code, err = run_cli(["fig7", "--backends=gloo,nccl", "--models=small", "--dry-run"])
    assert code == 0 and "[fig7] left out: nccl (NCCL unavailable here" in err, err


def test_ranks_that_cannot_fit_in_memory_are_refused_with_the_numbers(monkeypatch):
    monkeypatch.setattr(preflight, "memory_bytes", lambda: (24e9, 32e9))
    preflight.check_memory([TrainConfig(model="resnet50", world_size=2)])
    with pytest.raises(
        ValueError,
        match=r"world_size=64 needs at least 3\d\.\d GB .* but 24\.0 GB is available: "
        r"at most 4\d rank\(s\) fit here",
    ):
        preflight.check_memory(
            [TrainConfig(model="resnet50", world_size=2), TrainConfig(model="resnet50", world_size=64)]
        )
    monkeypatch.setenv("RANK", "0")  # under torchrun the ranks are placed already
    preflight.check_memory([TrainConfig(model="resnet50", world_size=64)])


def test_ranks_behind_an_emulated_link_keep_c10d_quiet_unless_the_user_set_a_level(monkeypatch):
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    assert sweep.rank_env("default", True) == {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    assert "TORCH_CPP_LOG_LEVEL" not in sweep.rank_env("retain", False)  # loopback: no namespace, nothing to quiet
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    assert sweep.rank_env("default", True) == {}


@pytest.mark.parametrize("flag", ["--dry-run", "--dry_run"])
def test_a_figure_takes_either_spelling_of_its_flags(flag):
    # python -m harness spells --dry_run; a user coming from it is not refused here
    code, err = run_cli(["fig7", "--models=small", flag, "--retry_errors"])
    assert code == 0 and "Traceback" not in err, err
