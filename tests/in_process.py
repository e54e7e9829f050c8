"""``python -m experiments ...`` run in the test's own process: the same entry point, its exit status and what it
printed, without a new interpreter importing torch again (seconds of a 2-core machine each)."""

import contextlib
import io
import os
from types import SimpleNamespace
from unittest import mock

from experiments.__main__ import main


def run_experiments(*argv: str, cwd=None, env: dict | None = None) -> SimpleNamespace:
    """Like ``subprocess.run([python, -m, experiments, *argv], cwd=cwd, env=os.environ | env)``: returncode,
    stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env or {}),
        contextlib.chdir(cwd or os.getcwd()),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
