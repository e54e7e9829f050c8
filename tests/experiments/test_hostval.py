"""make hostval: a repeat probes, measures no DDP and DDP at each cap interleaved, and sets each cap's prediction
(compute from the interleaved iterations) beside its measurement."""

import pandas as pd
import pytest

from experiments.tools import hostval


def test_a_repeat_predicts_each_cap_from_the_compute_measured_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_REPRO_RESULTS", str(tmp_path))
    cfg = hostval.Config(model="small", caps_mb=(0.01, 25.0), rounds=3, repeats=1, probe_iters=2)
    table = hostval.run(cfg, root=tmp_path)
    stored = pd.read_csv(tmp_path / "hostval" / "hostval.csv")
    assert stored["predicted_ms"].tolist() == pytest.approx(table["predicted_ms"].tolist())
    # one rank (DDP's host work alone) and two, each at both caps
    assert list(table["world_size"]) == [1, 1, 2, 2] and list(table["buckets"]) == [2, 1, 2, 1]
    assert set(table["threads_per_rank"]) == {1}  # each rank one intra-op thread, whatever the world size
    for r in table.itertuples():
        assert r.error_pct == pytest.approx((r.predicted_ms / r.measured_ms - 1) * 100)
        # per round the slowest rank's phase and whole iteration: no phase's median exceeds the iteration's
        assert 0 < max(r.measured_forward_ms, r.measured_backward_ms, r.measured_optimizer_ms) <= r.measured_ms
        assert r.predicted_host_ms > 0 and r.compute_ms > 0 and r.probe_compute_ms > 0
    # the interleaved compute is one value per repeat and world size; the caps differ in what DDP adds
    for _, one in table.groupby("world_size"):
        assert one["compute_ms"].nunique() == 1 and one["predicted_ms"].iloc[0] != one["predicted_ms"].iloc[1]
    assert sorted(p.name for p in (tmp_path / "hostval" / "calibrations").iterdir()) == [
        f"w{ws}-r0-{name}.json" for ws in (1, 2) for name in ("beside", "probe")
    ]


def test_the_summary_judges_the_median_of_each_repeats_own_error():
    rows = [
        dict(
            repeat=i,
            world_size=2,
            bucket_cap_mb=1.0,
            buckets=1,
            predicted_ms=p,
            measured_ms=m,
            error_pct=(p / m - 1) * 100,
            end_to_end_ms=e,
        )
        for i, (p, m, e) in enumerate([(100, 90, 90), (110, 104, 104), (40, 50, 60)])
    ]
    out = hostval.summary(pd.DataFrame(rows)).iloc[0]
    # the repeats' errors +11.1%, +5.8%, -20%: their median +5.8% misses the goal
    assert out.repeats == 3 and out.error_pct == pytest.approx(600 / 104) and not out.within_goal
    assert out.ci_lo_pct <= out.error_pct <= out.ci_hi_pct
    assert (out.repeat_lo_pct, out.repeat_hi_pct) == (pytest.approx(-20.0), pytest.approx(100 / 9))
    assert out.medians_error_pct == pytest.approx((100 / 90 - 1) * 100)  # medians 100 and 90, of different repeats
    assert out.end_to_end_error_pct == 0
