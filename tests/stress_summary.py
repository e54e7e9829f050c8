"""The tables ``make stress`` prints (``python -m tests.stress --summary`` alone prints them): what the CSVs under
its ``--out`` folder hold, counted per test, per DDP and ending, and per fresh clone."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def _tests_table(t: pd.DataFrame) -> list[str]:
    ran = t[t["outcome"] != "skipped"]
    bad = ran[ran["outcome"] == "failed"].groupby(["test", "hog"]).size().unstack(fill_value=0)
    quiet, hogged = (t[t["hog"] == h]["run"].nunique() for h in (False, True))
    parts = [
        f"{quiet} quiet runs + {hogged} beside a CPU hog, x {t['file'].nunique()} files: {len(ran)} "
        f"test runs, {int((ran['outcome'] == 'failed').sum())} failures"
    ]
    if not bad.empty:
        parts.append(bad.rename(columns={False: "quiet", True: "hog"}).to_string())
    return parts


def _exit_table(e: pd.DataFrame) -> str:
    table = e.groupby(["impl", "ending"]).agg(
        runs=("run", "size"),
        aborted=("aborted", "sum"),
        failed=("returncode", lambda r: int((r != 0).sum())),
        threads_left=("ranks_with_threads_left", lambda n: int((n > 0).sum())),
    )
    return (
        "exit script (runs with a rank aborted / any failure / a rank's Gloo threads alive at exit):\n"
        + table.to_string()
    )


def _clones_table(f: pd.DataFrame) -> str:
    lines = [f"fresh clones, `make test` from scratch: {int((f['returncode'] == 0).sum())} of {len(f)} passed"]
    for hog, g in f.groupby("hog"):
        lines.append(
            f"  {'beside a CPU hog' if hog else 'without a hog'}: {len(g)} runs, "
            f"{int(g['failed'].sum())} failed tests, {g['passed'].min()}-{g['passed'].max()} passed "
            f"each, {g['seconds'].min()}-{g['seconds'].max()} s each"
        )
    failed = f["failed_tests"].dropna() if "failed_tests" in f.columns else []
    lines += [f"  failed: {ids}" for ids in failed if ids]
    return "\n".join(lines)


def _fig7_line(g: pd.DataFrame) -> str:
    return (
        f"fresh clones, `make fig7`: {int((g['returncode'] == 0).sum())} of {len(g)} finished, "
        f"{g['seconds'].min()}-{g['seconds'].max()} s each"
    )


def summary(out: Path) -> str:
    """The two tables of what ``out`` holds: failures per test, and exits per DDP and ending."""
    parts = []
    if (out / "tests.csv").exists():
        parts += _tests_table(pd.read_csv(out / "tests.csv"))
    if (out / "exit.csv").exists():
        parts.append(_exit_table(pd.read_csv(out / "exit.csv")))
    if (out / "fresh_clones.csv").exists():
        parts.append(_clones_table(pd.read_csv(out / "fresh_clones.csv")))
    if (out / "fig7_clones.csv").exists():
        parts.append(_fig7_line(pd.read_csv(out / "fig7_clones.csv")))
    return "\n\n".join(parts) or f"nothing stored under {out}"
