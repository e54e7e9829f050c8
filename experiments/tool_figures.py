"""The tools' figures redrawn from what their runs stored (``tune``, ``simval``, ``timeline``), beside the drivers'
in ``python -m experiments plots``. Each reads ``source``, the results folder ``experiments.registry.root_for``
chose for it (so that choice is made in one place), and writes where ``root`` says."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments import common, plotting, verdicts
from harness import load_results
from harness.results import results_root


def draw_tune(source: Path, root=None) -> Path | None:
    """``tune.png`` from a stored tuning run: the recommendation from its stored calibration probe (the newest,
    where several are stored) over the default grid of caps, beside the caps measured for it. No probe, no run."""
    from experiments.tools import tune
    from simulator.model.calibration import Calibration
    from simulator.model.recommend import recommend

    cals = []
    for path in sorted((results_root(source) / tune.EXPERIMENT / "calibrations").glob("*.json")):
        try:
            cals.append(Calibration.load(path, stored_run=True))
        except (ValueError, TypeError, KeyError) as exc:  # an older version's probe
            print(f"[tune] {path.name} left out: {exc}")
    if not cals:
        print("[tune] no stored results yet; run `make tune` first")
        return None
    cal = max(cals, key=lambda c: str(c.meta.get("created_at", "")))
    p = cal.point
    cfg = tune.Config(model=p["model"], world_size=int(p["world_size"]), net=p["net"])
    rec = recommend(cal, cfg.grid_mb)
    out = dict(
        recommended_mb=rec.cap_mb, predicted=rec.predicted_ms, band=rec.band_ms, regret=rec.regret, measured=None
    )
    ok = common.ok_rows(load_results(tune.EXPERIMENT, source))
    if not ok.empty:
        ok = ok[(ok["model"] == cfg.model) & (ok["world_size"] == cfg.world_size) & (ok["net"] == cfg.net)]
        out["measured"] = verdicts.task_medians(ok, ["bucket_cap_mb"]) if not ok.empty else None
    path = tune.plot(out, cfg, root)
    print(f"[tune] wrote {path} (and .pdf)")
    print(tune.report(out))
    return path


def draw_simval(source: Path, root=None) -> Path | None:
    """``simval.png`` from the stored ``simval/validation.csv`` (every point's median prediction and measurement)."""
    from experiments.tools import simval

    path = results_root(source) / simval.EXPERIMENT / "validation.csv"
    if not path.exists():
        print("[simval] no stored results yet; run `make simval` first")
        return None
    out = pd.read_csv(path)
    png = simval.plot(out, root)
    print(f"[simval] wrote {png} (and .pdf)")
    print(simval.summary(out).to_string())
    return png


def draw_timeline(source: Path, root=None) -> Path | None:
    """``timeline.png`` and its Chrome trace from the last traced point stored under ``timeline/``."""
    from experiments.tools import timeline

    df = common.ok_rows(load_results(timeline.NAME, source))
    if not df.empty and "trace_buckets" in df.columns:
        df = df[df["trace_buckets"].fillna(False).astype(bool)]
    if df.empty:
        print("[timeline] no stored results yet; run `make timeline` first")
        return None
    last = (
        df.sort_values("started_at", kind="stable")["point_id"].iloc[-1]
        if "started_at" in df
        else df["point_id"].iloc[-1]
    )
    rows = timeline.median_iteration(df[df["point_id"] == last])
    r = rows.iloc[0]
    cfg = timeline.Config(
        model=r["model"],
        bucket_cap_mb=float(r["bucket_cap_mb"]),
        world_size=int(r["world_size"]),
        backend=r["backend"],
        profile=r["profile"],
        net=r["net"],
    )
    png = plotting.save(timeline.plot(rows, cfg), timeline.NAME, root)
    trace = png.with_name(f"{timeline.NAME}.trace.json")
    trace.write_text(json.dumps(timeline.chrome_trace(rows)))
    print(f"[timeline] wrote {png} (and .pdf) and {trace}")
    return png


DRAW = {"tune": draw_tune, "simval": draw_simval, "timeline": draw_timeline}  # figure name -> draw(source, root)
