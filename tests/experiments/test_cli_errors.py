"""Bad input on a command line ends as one ``error:`` line with exit status 2 and no traceback, before any rank
is spawned; everything accepted is a point that runs. Property-based (hypothesis) over every driver's config and
over bucket caps, plus the refusals that only the machine can make (no GPU for NCCL), and each entry point as a
user types it."""
import contextlib
import dataclasses
import io
import math
import os
import re
import runpy
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_impl.buckets import mb_to_bytes
from experiments import bench, registry
from experiments.__main__ import main
from harness import TrainConfig, env, preflight, sweep
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
    (["fig7", "--backends=nccl", "--models=resnet50"], "python -m experiments fig7",
     "backends='nccl': nothing this machine can run: NCCL unavailable here: 0 CUDA GPU(s) for 2 ranks"),
    (["fig9", "--backends=nccl", "--world_sizes=1,2"], "python -m experiments fig9", "NCCL unavailable here"),
    (["fig7", "--models=", "--dry-run"], "python -m experiments fig7", "no point to measure (models is empty)"),
    (["fig07"], "python -m experiments fig07", "did you mean fig7?"),
    (["report", "fig77"], "python -m experiments report", "unknown figure 'fig77'"),
    (["claims", "fig7"], "python -m experiments claims", "unexpected argument 'fig7'"),
    (["fig10", "--iters=6", "--sync_every=1,2,4", "--dry-run"], "python -m experiments fig10",
     "iters=6 must be a multiple of every n of sync_every, but not of 4: e.g. iters=8"),
    (["fig99"], "python -m experiments fig99", "unknown figure 'fig99'; choose one of fig2"),
    (["plots", "fig99"], "python -m experiments plots", "unknown figure 'fig99'"),
    (["predict", "--model=vgg"], "python -m experiments predict", "unknown model 'vgg'; choose one of"),
    (["predict", "--backend=nccl"], "python -m experiments predict", "backend='nccl' needs CUDA"),
    # what the simulation does not model is refused, not ignored
    (["predict", "--cluster=paper-v100", "--impl=local"], "python -m experiments predict",
     "impl='local': predict models DDP's buckets"),
    (["predict", "--cluster=paper-v100", "--optimizer=adam"], "python -m experiments predict",
     "optimizer='adam': predict does not model it"),
])

def test_refusals_of_the_machine_and_other_commands(argv, prog, message):
    code, err = _run(argv)
    if message is None:  # nothing this machine can run: no points, a clean exit
        assert code == 0 and "Traceback" not in err
        return
    assert _refused_in_one_line(code, err, prog) and message in err, err


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
    assert lines[0].startswith("python -m experiments.bench: error: models and bucket_caps_mb must be non-empty")
    assert lines[1] == ("python -m experiments.bench: error: backend='nccl' needs CUDA, but "
                        "torch.cuda.is_available() is False")


def test_a_sweep_some_of_whose_backends_run_goes_on_and_says_which_it_left_out():
    code, err = _run(["fig7", "--backends=gloo,nccl", "--models=small", "--dry-run"])
    assert code == 0 and "[fig7] left out: nccl (NCCL unavailable here" in err, err


def test_ranks_that_cannot_fit_in_memory_are_refused_with_the_numbers(monkeypatch):
    monkeypatch.setattr(preflight, "memory_bytes", lambda: (24e9, 32e9))
    preflight.check_memory([TrainConfig(model="resnet50", world_size=2)])
    with pytest.raises(ValueError, match=r"world_size=64 needs at least 3\d\.\d GB .* but 24\.0 GB is available: "
                                         r"at most 4\d rank\(s\) fit here"):
        preflight.check_memory([TrainConfig(model="resnet50", world_size=2), TrainConfig(model="resnet50",
                                                                                         world_size=64)])
    monkeypatch.setenv("RANK", "0")  # under torchrun the ranks are placed already
    preflight.check_memory([TrainConfig(model="resnet50", world_size=64)])


def test_ranks_behind_an_emulated_link_keep_c10d_quiet_unless_the_user_set_a_level(monkeypatch):
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    assert sweep.rank_env("default", True) == {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    assert "TORCH_CPP_LOG_LEVEL" not in sweep.rank_env("retain", False)  # loopback: no namespace, nothing to quiet
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    assert sweep.rank_env("default", True) == {}


# --------------------------------------------------------------------------- each entry point, as a user types it

REPO = Path(__file__).resolve().parents[2]
MPI = __import__("torch.distributed").distributed.is_mpi_available()
COMMANDS = {  # argv after `python -m`: (exit status, what the one stderr line says, or stdout for --help)
    "predict_missing_calibration": (["experiments", "predict", "--model=resnet50",
                                     "--calibration=/nonexistent/cal.json"], 2, "calibration '/nonexistent/cal.json'"),
    "timeline_unknown_model": (["experiments.timeline", "--model=gpt2"], 2, "unknown model 'gpt2'"),
    "timeline_nccl_without_gpu": (["experiments.timeline", "--backend=nccl"], 2, "backend='nccl' needs CUDA"),
    "timeline_world_size_too_big": (["experiments.timeline", "--world_size=100000"], 2,
                                    "world_size=100000 needs at least"),
    "tune_no_repeats": (["experiments.tune", "--repeats=0", "--measure_mb=5"], 2, "repeats=0"),
    # every group of the validation grid checked before its first probe (a bad later group failed hours in)
    "simval_unknown_model": (["experiments.simval", "--models=resnet50,vgg"], 2, "unknown model 'vgg'"),
    "simval_world_size_0": (["experiments.simval", "--nets=", "--world_sizes=0"], 2, "world_size must be a positive"),
    "simval_no_rounds": (["experiments.simval", "--rounds=0"], 2, "rounds=0: needs at least 1"),
    # checked before the GPU's absence is reported (or before minutes of the parity step on one)
    "gpu_check_unknown_model": (["experiments.gpu_check", "--models=vgg"], 2, "unknown model 'vgg'"),
    "paper_scale_infinite_bandwidth": (["experiments.paper_scale", "--bandwidth=inf"], 2,
                                       "bandwidth factor must be finite and > 0"),
    "bench_nothing_to_measure": (["experiments.bench", "--latency=false", "--memory=false"], 2, "nothing to measure"),
    "zero_as_a_module_help": (["experiments.zero", "--help"], 0, "usage: python -m experiments zero"),
    "hostval_same_world_size_twice": (["experiments.hostval", "--world_sizes=2,2"], 2,
                                      "world_sizes=[2, 2]: give one or more distinct world sizes"),
    "hostval_negative_cap": (["experiments.hostval", "--caps_mb=1,-1"], 2, "caps_mb=[1.0, -1.0]"),
    "fig10_iters_not_a_multiple": (["experiments", "fig10", "--iters=3", "--dry-run"], 2,
                                   "iters=3 must be a multiple of every n"),
    "fig7_misspelled_option": (["experiments", "fig7", "--bucket_cap_mb=5"], 2,
                               "unknown option '--bucket_cap_mb=5'; did you mean --bucket_caps_mb?"),
    "fig7_nccl_only": (["experiments", "fig7", "--backends=nccl"], 2, "NCCL unavailable here: 0 CUDA GPU(s)"),
    "fig7_mpi_only": (["experiments", "fig7", "--backends=mpi"], 2, "MPI unavailable here"),
    "plots_help": (["experiments", "plots", "--help"], 0, "usage: python -m experiments plots"),
    "report_help": (["experiments", "report", "--help"], 0, "usage: python -m experiments report"),
    "claims_help": (["experiments", "claims", "--help"], 0, "usage: python -m experiments claims"),
}
TIMEOUT_S = 120  # each is refused within seconds of its imports; a regression that starts work is cut off
# one command per entry module runs as a user types it, in a process of its own (all started at once); the others
# run that module in this process (runpy), the same code without importing torch again
AS_TYPED = ("fig7_misspelled_option", "timeline_unknown_model", "tune_no_repeats")


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    environ = {**os.environ, "DDP_REPRO_RESULTS": str(tmp_path_factory.mktemp("results")), "CUDA_VISIBLE_DEVICES": ""}
    procs = {name: subprocess.Popen([sys.executable, "-m", *COMMANDS[name][0]], cwd=REPO, env=environ, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
             for name in AS_TYPED}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def _in_this_process(argv, monkeypatch, results):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(results))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sys, "argv", list(argv))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    return done.value.code or 0, out.getvalue(), err.getvalue()


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # a package imports its submodule
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_entry_point_keeps_the_promise(commands, name, monkeypatch, tmp_path):
    if name == "fig7_mpi_only" and MPI:
        pytest.skip("this torch has MPI: an MPI sweep is not refused")
    argv, status, says = COMMANDS[name]
    if name in commands:
        try:
            out, err = commands[name].communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(commands[name].pid, 9)
            pytest.fail(f"`python -m {' '.join(argv)}` was not refused within {TIMEOUT_S} s")
        code = commands[name].returncode
    else:
        code, out, err = _in_this_process(argv, monkeypatch, tmp_path)
    assert code == status, (out, err)
    if status == 0:  # --help: the usage, nothing run
        assert out.startswith(says) and not err, (out, err)
        return
    prog = "python -m " + " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert len(err.splitlines()) == 1 and err.startswith(f"{prog}: error: ") and says in err, err


def test_a_terminated_command_ends_as_an_exception_so_its_pools_close():
    # SIGTERM (timeout, kill, scancel) raises SystemExit inside the body: `with` blocks and ExitStacks close their
    # rank pools (the network-emulation helper's session is not reached by the signal itself)
    from harness.errors import command_line

    closed = []

    def body() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            return 0
        finally:
            closed.append(True)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as done:
        command_line("prog", body)
    assert done.value.code == 128 + signal.SIGTERM and closed == [True]
    assert signal.getsignal(signal.SIGTERM) is before  # restored for whatever runs next


@pytest.mark.parametrize("target, world_size, says", [
    ("fig9", 4, "make fig9 sweeps world sizes"), ("zero", 2, "make zero sweeps world sizes"),
    ("gpu-check", 2, "runs on every visible GPU"), ("fig11", 4, "-m experiments fig11 --world_size=4"),
    ("hostval", 3, "make hostval sweeps world sizes"),
])
def test_make_passes_world_size_where_it_applies_and_refuses_it_elsewhere(target, world_size, says):
    done = subprocess.run(["make", "-n", target, f"WORLD_SIZE={world_size}"], cwd=REPO, capture_output=True,
                          text=True)
    refused = "sweeps" in says or "GPU" in says
    assert (done.returncode != 0) == refused and says in (done.stderr if refused else done.stdout), done


@pytest.mark.parametrize("flag", ["--dry-run", "--dry_run"])
def test_a_figure_takes_either_spelling_of_its_flags(flag):
    # python -m harness spells --dry_run; a user coming from it is not refused here
    code, err = _run(["fig7", "--models=small", flag, "--retry_errors"])
    assert code == 0 and "Traceback" not in err, err
