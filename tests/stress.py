"""The flake hunt, kept as a command (``make stress``): every test file that launches processes, run ``--runs``
times (every other run beside a CPU hog taking one core), the user-style exit script
(``tests/ddp_impl/exit_script.py``) ``--exit_runs`` times per DDP and ending, and ``--fresh_clones`` times CI's
command (``bash .ci/run``: ``make test`` from scratch) in a fresh clone of this repository's HEAD (the last
``--hog_clones`` of them beside a CPU hog). Prints failures per test, aborts per ending and the clones' outcomes,
and appends every outcome to ``<out>/tests.csv``, ``<out>/exit.csv`` and ``<out>/fresh_clones.csv`` as it goes (an
interrupted hunt keeps what it ran). ``--summary`` only prints the tables of what ``<out>`` holds. Columns:
``tests.csv`` run, hog, file, test, outcome (passed | failed | skipped); ``exit.csv`` run, hog, impl, ending,
returncode (-1: killed after hanging), aborted, ranks_with_threads_left; ``fresh_clones.csv`` run, hog, returncode,
seconds, passed, failed, skipped, failed_tests (their ids); ``fig7_clones.csv`` (``--fig7_clones``: the README's main
job, ``make fig7``, in a fresh clone) run, returncode, seconds; each also git_commit and torch_version, the code it
measured.

    make stress                                  # 10 runs per file, 30 per ending (hours on 2 cores)
    make stress ARGS="--runs=2 --exit_runs=5 --files=tests/harness/test_harness_launch.py"
    make stress ARGS="--runs=0 --exit_runs=0 --fresh_clones=13 --hog_clones=3"
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import torch

from harness.results import git_commit
from tests.ddp_impl.exit_script import ENDINGS, LEFT_MARK
from tests.stress_summary import summary

ROOT = Path(__file__).resolve().parents[1]
# A test file launches processes when its source (or the worker module it names) does any of these.
LAUNCHES = (
    "launch(",
    "RankPool",
    "run_sweep(",
    "run_point(",
    "subprocess",
    "spawn",
    "NamespacePool",
    "run_experiments(",
    "workers.",
)
ABORTED = ("SIGABRT", "terminate called")


def launching_files() -> list[Path]:
    files = sorted((ROOT / "tests").glob("**/test_*.py"))
    return [f for f in files if "torch_suite" not in f.parts and any(m in f.read_text() for m in LAUNCHES)]


@contextlib.contextmanager
def cpu_hog(on: bool):
    """A process spinning on one core while the block runs (nothing when ``on`` is False)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def _run(argv: list[str], cwd: Path, timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of ``argv`` in a session of its own; on a hang past ``timeout_s`` the whole
    session (its spawned ranks too) is killed and the status is None: a hang is a finding, not the hunt's end."""
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err + f"\n[stress] killed after {timeout_s:.0f} s"


def _append(path: Path, row: dict) -> None:
    """One row onto ``path``'s CSV, in the file's column order; a column the file lacks rewrites it with one."""
    header = next(csv.reader(path.open()), []) if path.exists() else []
    if header and set(row) - set(header):
        pd.concat([pd.read_csv(path), pd.DataFrame([row])], ignore_index=True).to_csv(path, index=False)
        return
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header or list(row))
        if not header:
            writer.writeheader()
        writer.writerow(row)


def run_file(path: Path) -> list[tuple[str, str]]:
    """(test id, outcome) for every test of one pytest run of ``path``; outcome passed, failed or skipped."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        code, _, _ = _run(
            [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
            ROOT,
            1800,
        )
        if code is None or not report.exists():
            return [(str(path.relative_to(ROOT)), "failed")]  # pytest itself died or hung
        outcomes = []
        for case in ET.parse(report).iter("testcase"):
            kinds = {child.tag for child in case}
            outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            outcomes.append((f"{case.get('classname')}::{case.get('name')}", outcome))
        return outcomes


def run_exit_script(impl: str, ending: str) -> dict:
    code, _, err = _run([sys.executable, str(ROOT / "tests/ddp_impl/exit_script.py"), impl, ending], ROOT, 300)
    return {
        "returncode": -1 if code is None else code,
        "aborted": any(m in err for m in ABORTED),
        "ranks_with_threads_left": err.count(LEFT_MARK),
    }


def run_fresh_clone(command=("bash", ".ci/run")) -> dict:
    """``command`` (CI's, by default) in a fresh clone of HEAD with ``../shared`` beside it (when this checkout has
    one)."""
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / ROOT.name
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        if (ROOT.parent / "shared").is_dir():
            (Path(tmp) / "shared").symlink_to(ROOT.parent / "shared")
        start = time.monotonic()
        code, out, _ = _run(list(command), clone, 5400)  # CI's limit
        seconds = time.monotonic() - start
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", out[-3000:])}
    return {
        "returncode": -1 if code is None else code,
        "seconds": round(seconds),
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
        "skipped": counts.get("skipped", 0),
        "failed_tests": " ".join(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)),
    }  # pytest's summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="make stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of every launching test file (default 10)")
    parser.add_argument(
        "--exit_runs", type=int, default=30, help="runs of the exit script per DDP and ending (default 30)"
    )
    parser.add_argument(
        "--fresh_clones", type=int, default=0, help="runs of CI's `make test` in a fresh clone (default 0)"
    )
    parser.add_argument(
        "--hog_clones", type=int, default=0, help="how many of those (the last) run beside a CPU hog (default 0)"
    )
    parser.add_argument(
        "--fig7_clones", type=int, default=0, help="runs of `make fig7` in a fresh clone, timed (default 0)"
    )
    parser.add_argument(
        "--endings", default=",".join(ENDINGS), help=f"the exit script's endings (default: {','.join(ENDINGS)})"
    )
    parser.add_argument("--files", default="", help="comma-separated test files (default: every launching one)")
    parser.add_argument(
        "--out", default=str(ROOT / "results" / "stress"), help="where the CSVs go (default results/stress)"
    )
    parser.add_argument("--summary", action="store_true", help="only print the tables of what --out holds")
    return parser


def _files_and_endings(parser: argparse.ArgumentParser, args) -> tuple[list[Path], list[str]]:
    """The test files and exit-script endings to run, refused through ``parser`` when one does not exist."""
    files = [Path(f).resolve() for f in args.files.split(",") if f] or launching_files()
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such test file: {', '.join(missing)}")
    endings = [e for e in args.endings.split(",") if e]
    if set(endings) - set(ENDINGS):
        parser.error(f"--endings: choose from {', '.join(ENDINGS)}")
    return files, endings


def _hunt_tests(runs: int, files: list[Path], out: Path, code: dict) -> None:
    for run in range(runs):
        hog = run % 2 == 1
        for i, path in enumerate(files, 1):
            name = str(path.relative_to(ROOT))
            print(
                f"[stress] run {run + 1}/{runs}{' beside a CPU hog' if hog else ''}: file {i}/{len(files)} {name}",
                file=sys.stderr,
                flush=True,
            )
            with cpu_hog(hog):
                outcomes = run_file(path)
            for test, outcome in outcomes:
                _append(out / "tests.csv", dict(run=run, hog=hog, file=name, test=test, outcome=outcome, **code))


def _hunt_exits(runs: int, endings: list[str], out: Path, code: dict) -> None:
    for run in range(runs):
        hog = run % 2 == 1
        print(f"[stress] exit script, round {run + 1}/{runs}", file=sys.stderr, flush=True)
        for impl in ("ours", "torch"):
            for ending in endings:
                with cpu_hog(hog):
                    result = run_exit_script(impl, ending)
                _append(out / "exit.csv", dict(run=run, hog=hog, impl=impl, ending=ending, **result, **code))


def _hunt_clones(fresh_clones: int, hog_clones: int, fig7_clones: int, out: Path, code: dict) -> None:
    for run in range(fresh_clones):
        hog = run >= fresh_clones - hog_clones
        print(
            f"[stress] fresh clone {run + 1}/{fresh_clones}{' beside a CPU hog' if hog else ''}",
            file=sys.stderr,
            flush=True,
        )
        with cpu_hog(hog):
            result = run_fresh_clone()
        _append(out / "fresh_clones.csv", dict(run=run, hog=hog, **result, **code))
    for run in range(fig7_clones):
        print(f"[stress] make fig7 in a fresh clone {run + 1}/{fig7_clones}", file=sys.stderr, flush=True)
        result = run_fresh_clone(("make", "fig7"))
        _append(
            out / "fig7_clones.csv",
            dict(run=run, returncode=result["returncode"], seconds=result["seconds"], **code),
        )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if min(args.runs, args.exit_runs, args.fresh_clones, args.hog_clones, args.fig7_clones) < 0:
        parser.error("--runs, --exit_runs, --fresh_clones, --hog_clones and --fig7_clones must be at least 0")
    out = Path(args.out)
    if not args.summary:
        files, endings = _files_and_endings(parser, args)
        code = dict(git_commit=git_commit(), torch_version=torch.__version__)  # which code each row measured
        out.mkdir(parents=True, exist_ok=True)
        _hunt_tests(args.runs, files, out, code)
        _hunt_exits(args.exit_runs, endings, out, code)
        _hunt_clones(args.fresh_clones, args.hog_clones, args.fig7_clones, out, code)
    print(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
