"""A user's script that ends the way torch's tutorials end theirs never aborts at exit with our DDP: its ranks
leave no Gloo thread running into the interpreter's finalization, whatever the ending (``exit_script.py``). The
threads are the cause, so their absence is asserted on every run, not only the rarer abort they can cause;
torch's DDP on the same script leaves them, which shows the check can see them. ``make stress`` runs each ending
many times."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ddp_impl.exit_script import ENDINGS, LEFT_MARK

SCRIPT = Path(__file__).with_name("exit_script.py")


def run_script(impl: str, ending: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), impl, ending], capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("ending", ENDINGS)
def test_ours_leaves_no_gloo_thread_at_exit_whatever_the_script_does_at_its_end(ending):
    done = run_script("ours", ending)
    assert done.returncode == 0, done.stderr[-2000:]
    assert LEFT_MARK not in done.stderr, done.stderr[-2000:]


def test_torchs_ddp_on_the_same_script_leaves_its_gloo_threads_running_into_the_exit():
    done = run_script("torch", "drop")
    assert done.stderr.count(LEFT_MARK) == 2, done.stderr[-2000:]
