"""``make autotune`` end to end on the small model: every repetition's search, its settled latency beside the fixed
caps, the summary and the figure; and what it refuses."""

import pandas as pd

from tests.in_process import run_experiments

ARGS = ("--models=small", "--nets=loopback", "--iters=2", "--warmup=1", "--caps_mb=0,0.01,25")


def test_the_search_is_measured_beside_every_fixed_cap(tmp_path):
    env = {"DDP_REPRO_RESULTS": str(tmp_path)}
    done = run_experiments("autotune", *ARGS, "--repeats=2", "--prior_mb=0,0.01", env=env)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "autotune" / "summary.csv")
    (row,) = table.itertuples()
    assert (row.model, row.repeats, row.best_fixed_mb in (0, 0.01, 25)) == ("small", 2, True)
    assert len(row.settled_caps.split()) == 2 and row.iterations_max <= 30
    assert row.settled_vs_best_lo <= row.settled_vs_best <= row.settled_vs_best_hi
    assert (tmp_path / "figures" / "autotune.png").stat().st_size > 0


def test_without_a_prior_a_model_smaller_than_every_cap_settles_at_once(tmp_path):
    done = run_experiments("autotune", *ARGS, "--repeats=2", env={"DDP_REPRO_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    (row,) = pd.read_csv(tmp_path / "autotune" / "summary.csv").itertuples()
    assert (row.prior, row.settled_caps, row.iterations_max) == ("coarse-to-fine", "25 25", 3)


def test_one_repetition_is_refused_in_one_line(tmp_path):
    done = run_experiments("autotune", *ARGS, "--repeats=1", env={"DDP_REPRO_RESULTS": str(tmp_path)})
    assert done.returncode == 2 and "repeats=1" in done.stderr and len(done.stderr.strip().splitlines()) == 1
