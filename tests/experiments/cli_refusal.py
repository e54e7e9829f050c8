"""What the command-line refusal tests share: ``python -m experiments`` run in this process with its output
captured, what a one-line refusal looks like, and a guard that fails any test that spawns a rank."""

import contextlib
import io
import re

import pytest

from experiments.__main__ import main
from harness import sweep
from harness.launch import env


def run_cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: malformed option values
            code = exc.code
    return code, err.getvalue()


@contextlib.contextmanager
def no_rank_spawns(tmp_path_factory):
    """Refusals come before any rank is spawned: spawning one fails the test; results go to a scratch folder and
    the machine has no GPU."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep._Pools, "get_for", lambda *a, **k: pytest.fail("a rank was spawned"))
        mp.setenv("DDP_REPRO_RESULTS", str(tmp_path_factory.mktemp("results")))
        mp.setattr(env, "cuda_available", lambda: False)
        yield


def refused_in_one_line(code, err: str, prog: str) -> bool:
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return code == 2 and "Traceback" not in err and re.match(rf"{re.escape(prog)}: error: \S", last) is not None
