"""``make stress``'s bookkeeping (the hunt itself takes hours and is not part of ``make test``): which files it
runs, and that its tables count what its CSVs hold."""

import pandas as pd

from tests import stress


def test_stress_runs_the_files_that_launch_processes_and_only_those():
    names = {f.name for f in stress.launching_files()}
    assert {"test_harness_launch.py", "test_equivalence.py", "test_exit.py", "test_slurm.py"} <= names
    assert not names & {"test_stats.py", "test_buckets.py", "test_stress.py"}


def test_stress_summary_counts_failures_per_test_aborts_per_ending_and_failed_clones(tmp_path):
    pd.DataFrame(
        dict(
            run=[0, 0, 1, 1],
            hog=[False, False, True, True],
            file=["a.py"] * 4,
            test=["a::x", "a::y", "a::x", "a::y"],
            outcome=["passed", "skipped", "failed", "passed"],
        )
    ).to_csv(tmp_path / "tests.csv", index=False)
    pd.DataFrame(
        dict(
            run=[0, 1, 0],
            hog=[False, True, False],
            impl=["ours", "ours", "torch"],
            ending=["none", "none", "none"],
            returncode=[0, 0, 1],
            aborted=[False, False, True],
            ranks_with_threads_left=[0, 0, 2],
        )
    ).to_csv(tmp_path / "exit.csv", index=False)
    pd.DataFrame(
        dict(
            run=[0, 1],
            hog=[False, True],
            returncode=[0, 1],
            seconds=[400, 500],
            passed=[470, 469],
            failed=[0, 1],
            skipped=[1, 1],
        )
    ).to_csv(tmp_path / "fresh_clones.csv", index=False)
    text = stress.summary(tmp_path)
    assert "1 quiet runs + 1 beside a CPU hog, x 1 files: 3 test runs, 1 failures" in text
    assert [line.split()[-3:] for line in text.splitlines() if line.startswith(("ours", "torch"))] == [
        ["0", "0", "0"],
        ["1", "1", "1"],
    ]
    assert "1 of 2 passed" in text and "beside a CPU hog: 1 runs, 1 failed tests" in text
