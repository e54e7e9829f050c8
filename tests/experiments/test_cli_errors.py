"""Bad input on a command line ends as one ``error:`` line with exit status 2 and no traceback, before any rank
is spawned; everything accepted is a point that runs. Property-based (hypothesis) over every driver's config and
over bucket caps, plus the refusals that only the machine can make (no GPU for NCCL)."""
import contextlib
import dataclasses
import io
import math
import re
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_impl.buckets import mb_to_bytes
from experiments import bench, registry
from experiments.__main__ import main
from harness import TrainConfig, env, sweep
from harness.config import MODELS, parse_dataclass

DRIVERS = registry.drivers()
CHOICES = {  # values worth trying for fields with a vocabulary: the valid ones and a few that are not
    "models": [*MODELS, "vgg", ""], "model": [*MODELS, "vgg"], "backends": ["gloo", "nccl", "mpi"],
    "backend": ["auto", "gloo", "nccl", "mpi"], "profile": ["auto", "cpu", "paper", "tpu"],
    "impl": ["ours", "torch", "local", "theirs"], "net": ["auto", "loopback", "1gbit", "500mbit", "0mbit", "-1gbit",
                                                         "fast", "10 gbit"],
    "comm_hook": ["", "fp16", "bf16", "allreduce", "int4"], "dataset": ["digits", "cifar10", "mnist"],
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


def _run(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: malformed option values
            code = exc.code
    return code, err.getvalue()


@pytest.fixture(scope="module", autouse=True)
def nothing_spawns(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep._Pools, "get_for", lambda *a, **k: pytest.fail("a rank was spawned"))
        mp.setenv("DDP_REPRO_RESULTS", str(tmp_path_factory.mktemp("results")))
        mp.setattr(env, "cuda_available", lambda: False)
        yield


def _refused_in_one_line(code, err: str, prog: str) -> bool:
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return code == 2 and "Traceback" not in err and re.match(rf"{re.escape(prog)}: error: \S", last) is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(driver_args())
def test_every_driver_config_dry_runs_or_is_refused_in_one_line(case):
    name, args = case
    code, err = _run([name, *args, "--dry-run"])
    if code == 0:
        assert "Traceback" not in err
        driver = DRIVERS[name]
        for point in driver.points(parse_dataclass(driver.Config, args)):  # accepted means runnable: caps a DDP takes, finite numbers
            if isinstance(point, TrainConfig):
                mb_to_bytes(point.bucket_cap_mb)
            assert all(math.isfinite(v) for v in dataclasses.asdict(point).values() if isinstance(v, float))
    else:
        assert _refused_in_one_line(code, err, f"python -m experiments {name}"), (args, code, err)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3))
def test_bucket_caps_are_accepted_exactly_when_a_ddp_takes_them(caps):
    code, err = _run(["fig7", f"--bucket_caps_mb={','.join(map(repr, caps))}", "--dry-run"])
    takes = all(0 <= c < math.inf for c in caps)
    assert (code == 0) == takes, (caps, code, err)
    if not takes:
        assert _refused_in_one_line(code, err, "python -m experiments fig7") and "bucket_cap_mb" in err
        with pytest.raises(ValueError, match="bucket caps must be finite and >= 0"):
            for c in caps:
                mb_to_bytes(c)


@pytest.mark.parametrize("argv, prog, message", [
    (["fig7", "--backends=nccl", "--models=resnet50"], "python -m experiments fig7", None),
    (["fig99"], "python -m experiments fig99", "unknown figure 'fig99'; choose one of fig2"),
    (["plots", "fig99"], "python -m experiments plots", "unknown figure 'fig99'"),
    (["predict", "--model=vgg"], "python -m experiments predict", "unknown model 'vgg'; choose one of"),
    (["predict", "--backend=nccl"], "python -m experiments predict", "backend='nccl' needs CUDA"),
])
def test_refusals_of_the_machine_and_other_commands(argv, prog, message):
    code, err = _run(argv)
    if message is None:  # nothing this machine can run: no points, a clean exit
        assert code == 0 and "Traceback" not in err
        return
    assert _refused_in_one_line(code, err, prog) and message in err, err


def test_bench_refuses_in_one_line(capsys):
    assert bench.main(["--bucket_caps_mb=-1"]) == 2
    assert bench.main(["--backend=nccl"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("python -m experiments.bench: error: models and bucket_caps_mb must be non-empty")
    assert lines[1] == ("python -m experiments.bench: error: backend='nccl' needs CUDA, but "
                        "torch.cuda.is_available() is False")
