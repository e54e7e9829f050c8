"""``python -m experiments bucket-cost`` on one rank: every DDP's cost per bucket and every step are stored."""

import pandas as pd

from experiments.tools import bucket_cost


def test_bucket_cost_stores_each_ddps_cost_per_bucket_and_each_step(tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path))
    assert bucket_cost.main(["--rounds=3", "--warmup=2"]) == 0
    per = pd.read_csv(tmp_path / "bucket_cost" / "per_bucket.csv").set_index("ddp")
    steps = pd.read_csv(tmp_path / "bucket_cost" / "steps.csv").set_index("step")
    assert list(per.index) == ["torch", "ours", "ours_notiming", "floor"]
    assert (per["buckets"] == 800).all()  # tiny-layers at cap 0: a bucket per gradient
    assert per.loc["torch", "over_torch"] == 1.0 and per.loc["floor", "over_floor"] == 1.0
    assert (per[["over_torch", "over_floor", "us_over_local_per_bucket"]] > 0).all().all()
    assert list(steps.index) == list(bucket_cost.STEPS) and (steps["us_per_bucket"] > 0).all()


def test_bucket_cost_refuses_a_world_size_it_cannot_run(capsys):
    assert bucket_cost.main(["--world_size=3"]) == 2
    assert "world_size must be 1 or 2" in capsys.readouterr().err
