"""``python -m harness`` and ``python -m harness.workloads.smoke`` keep the command-line contract: bad input ends as one
``<prog>: error:`` line with exit status 2 (a misspelled option names the closest one), before any rank starts;
``--help`` lists every option and exits 0."""

import contextlib
import io

import pytest

from harness import __main__ as cli
from harness import sweep
from harness.workloads import smoke


def _run(main, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help, malformed options
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def nothing_spawns(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep._Pools, "get_for", lambda *a, **k: pytest.fail("a rank was spawned"))
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)


@pytest.mark.parametrize(
    "main, argv, prog, says",
    [
        (cli.main, [], "python -m harness", "give the kind first"),
        (cli.main, ["--model=small", "train"], "python -m harness", "give the kind first"),
        (
            cli.main,
            ["trian"],
            "python -m harness trian",
            "unknown kind 'trian'; choose one of train, allreduce; did you mean train?",
        ),
        (
            cli.main,
            ["train", "--modle=small"],
            "python -m harness train",
            "unknown option '--modle=small'; did you mean --model?",
        ),
        (cli.main, ["train", "--world_size=x"], "python -m harness train", "invalid int value: 'x'"),
        (cli.main, ["train", "--model=gpt2", "--dry_run"], "python -m harness train", "unknown model 'gpt2'"),
        (
            cli.main,
            ["allreduce", "--params_per_call=10", "--total_params=5", "--dry_run"],
            "python -m harness allreduce",
            "params_per_call=10 exceeds total_params=5",
        ),
        (
            smoke.main,
            ["--itres=3"],
            "python -m harness.workloads.smoke",
            "unknown option '--itres=3'; did you mean --iters?",
        ),
        (smoke.main, ["--backend=mpi"], "python -m harness.workloads.smoke", "invalid choice: 'mpi'"),
        (smoke.main, ["--iters=0"], "python -m harness.workloads.smoke", "--iters=0: give at least 1"),
        (smoke.main, [], "python -m harness.workloads.smoke", "run under torchrun (RANK is not set)"),
    ],
)
def test_bad_input_is_refused_in_one_line(main, argv, prog, says):
    code, _, err = _run(main, argv)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"{prog}: error: ") and says in err, err


@pytest.mark.parametrize(
    "main, argv, options",
    [
        (cli.main, ["--help"], ["{train,allreduce}"]),
        (cli.main, ["train", "--help"], ["--model", "--world_size", "--experiment", "--dry_run", "(default: 'small')"]),
        (cli.main, ["allreduce", "-h"], ["--params_per_call", "--root"]),
        (smoke.main, ["--help"], ["--iters", "--backend", "--timeout_s", "--out", "(default: 5)"]),
    ],
)
def test_help_lists_the_options(main, argv, options):
    code, out, err = _run(main, argv)
    assert code == 0 and not err and out.startswith("usage: python -m harness")
    assert all(o in out for o in options), out


@pytest.mark.parametrize("flag", ["--dry_run", "--dry-run"])
def test_dry_run_takes_either_spelling(flag):
    # the experiments spell their flags with hyphens, the harness's fields with underscores: both take either
    code, out, err = _run(cli.main, ["train", "--model=small", "--iters=2", flag])
    assert code == 0 and "pending" in out + err, (out, err)
