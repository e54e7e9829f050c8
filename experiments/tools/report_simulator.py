"""``make report``'s regions on the simulator: its validation (``make simval``, with the calibration version its
probes had) and its check where the host sets the pace (``make hostval``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.results import REFERENCE


def _calibration_note(versions) -> str:
    from simulator.model.calibration import VERSION

    old = sorted({int(v) for v in versions if int(v) != VERSION})
    return (
        (
            f" **Stale**: calibration version {', '.join(map(str, old))}, the code is at version {VERSION}; "
            "`make simval` measures it again."
        )
        if old
        else f" Calibration version {VERSION}, the code's."
    )


def _calibration_versions(folder: Path) -> list[int]:
    import json

    return [json.loads(p.read_text()).get("meta", {}).get("version", 0) for p in folder.glob("*.json")]


def simval() -> str:
    from experiments.tools.simval import summary

    where = REFERENCE / "simval"
    errors = summary(pd.read_csv(where / "validation.csv"))
    tuning = pd.read_csv(where / "tuning.csv")
    lines = ["| model | points | median error % | worst % |", "|---|---|---|---|"]
    lines += [f"| {m} | {r['points']:.0f} | {r['median']} | {r['worst']} |" for m, r in errors.iterrows()]
    validation = pd.read_csv(where / "validation.csv")
    grid = "; ".join(
        f"{m}: {len(g)} points at {', '.join(sorted(g['net'].unique()))} and "
        f"{', '.join(str(w) for w in sorted(g['world_size'].unique()))} ranks, {g['rounds'].max()} rounds"
        for m, g in validation.groupby("model")
    )
    within = int(tuning["within_goal"].sum())
    ratio = tuning["confirmed_over_best"].fillna(tuning["recommended_over_best"])  # side by side where measured
    note = (
        f"\n\nGrid: {grid}. Recommended cap within 2% of the best measured: {within} of {len(tuning)} (model, "
        f"world size, link); recommended / best {ratio.min():.3f}-{ratio.max():.3f} (side by side where they "
        f"differ), torch's 25 MiB / best up to {tuning['default_over_best'].max():.3f}."
    )
    return "\n".join(lines) + note + _calibration_note(_calibration_versions(where / "calibrations"))


def hostval() -> str:
    from experiments.tools.hostval import summary

    runs = sorted((REFERENCE / "hostval").glob("run*.csv"), key=lambda p: int(p.stem[3:]))
    table = summary(pd.read_csv(runs[-1]))
    lines = ["| ranks | cap MiB | buckets | repeats | error % [95% CI] |", "|---|---|---|---|---|"]
    lines += [
        f"| {r.world_size} | {r.bucket_cap_mb:g} | {r.buckets} | {r.repeats} | {r.error_pct:+.1f} "
        f"[{r.ci_lo_pct:+.1f}, {r.ci_hi_pct:+.1f}] |"
        for r in table.itertuples()
    ]
    return "\n".join(lines)
