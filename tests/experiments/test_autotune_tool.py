"""``make autotune`` end to end on the small model: every repetition's search, its settled latency beside the fixed
caps, the summary and the figure; and what it refuses."""

import pandas as pd

from tests.in_process import run_experiments

ARGS = ("--models=small", "--iters=2", "--warmup=1", "--warmup_fixed=2", "--caps_mb=0,0.01,25")


def test_the_search_is_measured_beside_every_fixed_cap(tmp_path):
    env = {"DDP_REPRO_RESULTS": str(tmp_path)}
    done = run_experiments("autotune", *ARGS, "--nets=loopback", "--repeats=2", "--prior_mb=0,0.01", env=env)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "autotune" / "summary.csv")
    (row,) = table.itertuples()
    assert (row.model, row.repeats, row.best_fixed_mb in (0, 0.01, 25)) == ("small", 2, True)
    assert len(row.settled_caps.split()) == 2 and row.iterations_max <= 30
    assert row.settled_vs_best_lo <= row.settled_vs_best <= row.settled_vs_best_hi
    assert (tmp_path / "figures" / "autotune.png").stat().st_size > 0


def test_without_a_prior_a_model_smaller_than_every_cap_settles_at_once_and_a_skipped_pair_is_left_out(tmp_path):
    nets = ("--nets=loopback,1gbit", "--skip=small@1gbit")
    done = run_experiments("autotune", *ARGS, *nets, "--repeats=2", env={"DDP_REPRO_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    (row,) = pd.read_csv(tmp_path / "autotune" / "summary.csv").itertuples()
    assert (row.net, row.prior, row.settled_caps, row.iterations_max) == ("loopback", "coarse-to-fine", "25 25", 3)
    points = pd.concat(pd.read_csv(f) for f in (tmp_path / "autotune" / "points").glob("*.csv"))
    assert set(points["net"]) == {"loopback"} and set(points["warmup"]) == {1, 2}  # fixed points warmed longer


def test_one_repetition_and_a_skip_of_no_pair_are_refused_in_one_line(tmp_path):
    env = {"DDP_REPRO_RESULTS": str(tmp_path)}
    for bad, named in (("--repeats=1", "repeats=1"), ("--skip=small@10gbit", "small@10gbit")):
        done = run_experiments("autotune", *ARGS, "--nets=loopback", "--repeats=2", bad, env=env)
        assert done.returncode == 2 and named in done.stderr and len(done.stderr.strip().splitlines()) == 1
