"""The validation grid and the tuning check of ``make simval`` (no measurement: synthetic tables)."""

import pandas as pd
import pytest

from experiments.tools import simval


def test_no_sync_points_measure_whole_cycles_after_two():
    cfg = simval.Config(models=("small",), nets=("1gbit",), world_sizes=(), sync_every=(2, 8), no_sync_cycles=3)
    [(probe, points)] = simval.groups(cfg)
    no_sync = {p.sync_every: (p.iters, p.warmup) for p in points if p.sync_every > 1}
    assert no_sync == {2: (6, 4), 8: (24, 16)}  # the first synchronized iteration and the rebuild not measured
    assert probe.iters == cfg.iters and all(p.iters == cfg.iters for p in points if p.sync_every == 1)


def test_no_sync_latency_amortizes_the_median_of_each_kind_of_iteration():
    # n = 4: synchronized 500, 520, 900 (a slow spell) -> median 520; skipped 300 x 8, 310 -> 300
    synced = [True, False, False, False] * 3
    total = [500, 300, 300, 300, 520, 300, 300, 310, 900, 300, 300, 300]
    rows = pd.DataFrame(dict(synced=synced, total_ms=total))
    assert simval.measured_ms(rows, 4) == pytest.approx((520 + 3 * 300) / 4)
    assert simval.measured_ms(rows, 1) == pytest.approx(300)  # every iteration synchronized: the median


def _row(cap, measured, predicted, net="1gbit", **kw):
    return {
        **dict(
            model="resnet50",
            world_size=2,
            net=net,
            bucket_cap_mb=cap,
            overlap=True,
            round_robin_groups=1,
            net_rate_mbit=1000.0,
            sync_every=1,
            measured_ms=measured,
            predicted_ms=predicted,
        ),
        **kw,
    }


def test_tuning_sets_the_recommended_cap_beside_the_best_measured():
    # 1gbit: 1 MiB has the least worst regret though 25 MiB is predicted lower; 2gbit: a tie in regret goes to the
    # lower prediction
    out = pd.DataFrame(
        [
            _row(1, 110, 104, regret=1.01),
            _row(5, 100, 105, regret=1.03),
            _row(25, 104, 103, regret=1.02),
            _row(5, 50, 90, overlap=False),
            _row(1, 60, 60, sync_every=2),  # not cap points
            _row(5, 200, 210, net="2gbit", regret=1.0),
            _row(25, 210, 200, net="2gbit", regret=1.0),
        ]
    )
    t = simval.tuning(out).set_index("net")
    assert t.loc["1gbit", "recommended_mb"] == 1 and t.loc["1gbit", "best_measured_mb"] == 5
    assert t.loc["1gbit", "recommended_over_best"] == pytest.approx(1.1)
    assert t.loc["1gbit", "default_over_best"] == pytest.approx(1.04)
    assert t.loc["2gbit", "recommended_mb"] == 25 and t.loc["2gbit", "recommended_over_best"] == pytest.approx(1.05)


def test_rounds_combine_into_median_prediction_over_median_measurement():
    rounds = pd.DataFrame(
        [
            _row(5, 100, 90, round=0, regret=1.0),
            _row(5, 120, 126, round=1, regret=1.2),
            _row(5, 110, 99, round=2, regret=1.1),
            _row(25, 200, 220, round=0, regret=1.0),
        ]
    )
    out = simval.combine(rounds).set_index("bucket_cap_mb")
    assert out.loc[5, "rounds"] == 3 and out.loc[25, "rounds"] == 1
    assert out.loc[5, "error_pct"] == pytest.approx((99 / 110 - 1) * 100)  # not the mean of per-round errors
    assert out.loc[25, "error_pct"] == pytest.approx(10.0)
    assert out.loc[5, "regret"] == pytest.approx(1.1)


def _fake_sweep(swept, apart, failed):
    """A stand-in for run_sweep that stores ``iters`` rows per point without running one. ``apart``: nets whose caps
    ran in separate tasks; ``failed``: the (net, cap) points that died; every point swept is appended to ``swept``."""
    from harness.config import point_id, validate

    def fake_sweep(experiment, points, root=None):
        swept.extend(points)
        rows = []
        for p in points:  # per repetition one task; the host drifts between repetitions, 5 MiB is 1 % slower
            drift = 1 + 0.1 * (p.repeat - simval.CONFIRM_REPEAT)
            group = f"task{p.repeat}" + (f"-{p.bucket_cap_mb}" if p.net in apart else "")
            ms = 1000 * drift * (1.01 if p.bucket_cap_mb == 5 else 1.0)
            error = "died" if (p.net, p.bucket_cap_mb) in failed else ""
            rows += [
                dict(
                    point_id=point_id(validate(p)),
                    error=error,
                    synced=True,
                    bucket_cap_mb=p.bucket_cap_mb,
                    repeat=p.repeat,
                    group=group,
                    total_ms=ms + k,
                )
                for k in range(p.iters)
            ]
        return pd.DataFrame(rows)

    return fake_sweep


def _tuning_table() -> pd.DataFrame:
    """1gbit: the recommendation (5 MiB) is not the best measured cap (1 MiB); 2gbit: it is."""
    return pd.DataFrame(
        [
            dict(
                model="resnet50",
                world_size=2,
                net="1gbit",
                recommended_mb=5.0,
                best_measured_mb=1.0,
                recommended_over_best=1.05,
                default_over_best=1.1,
            ),
            dict(
                model="resnet50",
                world_size=2,
                net="2gbit",
                recommended_mb=5.0,
                best_measured_mb=5.0,
                recommended_over_best=1.0,
                default_over_best=1.1,
            ),
        ]
    )


def test_confirm_measures_a_mismatched_recommendation_beside_the_best_side_by_side(monkeypatch, tmp_path):
    """Only the scenario whose recommendation is not the best measured cap is measured again; its verdict is the
    median over repetitions of the paired ratio, not the grid's biased one."""
    swept, apart, failed = [], set(), set()
    monkeypatch.setattr(simval, "run_sweep", _fake_sweep(swept, apart, failed))
    cfg = simval.Config(
        models=("resnet50",), nets=("1gbit", "2gbit"), world_sizes=(), confirm_repeats=3, confirm_iters=4
    )
    table = _tuning_table()
    out = simval.confirm(cfg, table, root=tmp_path).set_index("net")
    assert {(p.net, p.bucket_cap_mb, p.iters) for p in swept} == {("1gbit", 5.0, 4), ("1gbit", 1.0, 4)}
    assert len(swept) == 6
    assert out.loc["1gbit", "confirmed_over_best"] == pytest.approx(1.01, abs=1e-3)
    assert out.loc["1gbit", "within_goal"] and out.loc["2gbit", "within_goal"]
    assert pd.isna(out.loc["2gbit", "confirmed_over_best"])
    assert list(out["verdict"]) == ["side by side", "same cap"]
    assert pd.read_csv(tmp_path / "simval" / "tuning.csv")["within_goal"].all()
    # the two caps in separate tasks (one stored beside another cap earlier): said so; a cap that failed: the grid's
    apart.add("1gbit")
    assert simval.confirm(cfg, table, root=tmp_path).loc[0, "verdict"] == "side by side, measured apart"
    failed.add(("1gbit", 1.0))
    grid = simval.confirm(cfg, table, root=tmp_path)
    assert grid.loc[0, "verdict"] == "grid (not measured side by side)" and not grid.loc[0, "within_goal"]
    assert simval.confirm(cfg, table.iloc[:0], root=tmp_path).empty
    # no confirmation: the grid's ratio decides
    monkeypatch.setattr(simval, "run_sweep", None)
    plain = simval.confirm(
        simval.Config(models=("resnet50",), nets=("1gbit",), world_sizes=(), confirm_repeats=0), table, root=tmp_path
    ).set_index("net")
    assert not plain.loc["1gbit", "within_goal"]
