"""Each entry point as a user types it: a bad command line ends as one ``error:`` line with exit status 2 and no
traceback, --help prints the usage and runs nothing; a terminated command closes its pools; `make` passes
WORLD_SIZE only where it applies."""

import contextlib
import io
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.experiments.cli_refusal import no_rank_spawns


@pytest.fixture(scope="module", autouse=True)
def nothing_spawns(tmp_path_factory):
    with no_rank_spawns(tmp_path_factory):
        yield


REPO = Path(__file__).resolve().parents[2]
MPI = __import__("torch.distributed").distributed.is_mpi_available()
COMMANDS = {  # argv after `python -m`: (exit status, what the one stderr line says, or stdout for --help)
    "predict_missing_calibration": (
        ["experiments", "predict", "--model=resnet50", "--calibration=/nonexistent/cal.json"],
        2,
        "calibration '/nonexistent/cal.json'",
    ),
    "timeline_unknown_model": (["experiments", "timeline", "--model=gpt2"], 2, "unknown model 'gpt2'"),
    "timeline_nccl_without_gpu": (["experiments", "timeline", "--backend=nccl"], 2, "backend='nccl' needs CUDA"),
    "timeline_world_size_too_big": (
        ["experiments", "timeline", "--world_size=100000"],
        2,
        "world_size=100000 needs at least",
    ),
    "tune_no_repeats": (["experiments", "tune", "--repeats=0", "--measure_mb=5"], 2, "repeats=0"),
    # every group of the validation grid checked before its first probe (a bad later group failed hours in)
    "simval_unknown_model": (["experiments", "simval", "--models=resnet50,vgg"], 2, "unknown model 'vgg'"),
    "simval_world_size_0": (
        ["experiments", "simval", "--nets=", "--world_sizes=0"],
        2,
        "world_size must be a positive",
    ),
    "simval_no_rounds": (["experiments", "simval", "--rounds=0"], 2, "rounds=0: needs at least 1"),
    # checked before the GPU's absence is reported (or before minutes of the parity step on one)
    "gpu_check_unknown_model": (["experiments", "gpu-check", "--models=vgg"], 2, "unknown model 'vgg'"),
    "paper_scale_infinite_bandwidth": (
        ["experiments", "paper-scale", "--bandwidth=inf"],
        2,
        "bandwidth factor must be finite and > 0",
    ),
    "bench_nothing_to_measure": (
        ["experiments", "bench", "--latency=false", "--memory=false"],
        2,
        "nothing to measure",
    ),
    "zero_as_a_module_help": (["experiments.figures.zero", "--help"], 0, "usage: python -m experiments zero"),
    "hostval_same_world_size_twice": (
        ["experiments", "hostval", "--world_sizes=2,2"],
        2,
        "world_sizes=[2, 2]: give one or more distinct world sizes",
    ),
    "hostval_negative_cap": (["experiments", "hostval", "--caps_mb=1,-1"], 2, "caps_mb=[1.0, -1.0]"),
    "fig10_iters_not_a_multiple": (
        ["experiments", "fig10", "--iters=3", "--dry-run"],
        2,
        "iters=3 must be a multiple of every n",
    ),
    "fig7_misspelled_option": (
        ["experiments", "fig7", "--bucket_cap_mb=5"],
        2,
        "unknown option '--bucket_cap_mb=5'; did you mean --bucket_caps_mb?",
    ),
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
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", *COMMANDS[name][0]],
            cwd=REPO,
            env=environ,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for name in AS_TYPED
    }
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
    from harness.launch.errors import command_line

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


@pytest.mark.parametrize(
    "target, world_size, says",
    [
        ("fig9", 4, "make fig9 sweeps world sizes"),
        ("zero", 2, "make zero sweeps world sizes"),
        ("gpu-check", 2, "runs on every visible GPU"),
        ("fig11", 4, "-m experiments fig11 --world_size=4"),
        ("hostval", 3, "make hostval sweeps world sizes"),
    ],
)
def test_make_passes_world_size_where_it_applies_and_refuses_it_elsewhere(target, world_size, says):
    done = subprocess.run(["make", "-n", target, f"WORLD_SIZE={world_size}"], cwd=REPO, capture_output=True, text=True)
    refused = "sweeps" in says or "GPU" in says
    assert (done.returncode != 0) == refused and says in (done.stderr if refused else done.stdout), done
