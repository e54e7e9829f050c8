"""``make bench``'s statistics: one point's medians, paired ratios and ideal bounds, and each model's caps pooled."""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.stats import bootstrap_median_ci, pooled_geomean_ci, ratio_of_medians_ci

PER_GRADIENT = ", a bucket per gradient"  # cap 0's points, pooled apart from the model's other caps


def _rounds(samples: pd.DataFrame) -> pd.DataFrame:
    """Latency per round (rows) and variant (columns): the slowest rank's."""
    return samples.groupby(["variant", "round"])["total_ms"].max().unstack("variant")


def _per_round(rounds: pd.DataFrame, variant: str, reference: str) -> np.ndarray:
    """variant / reference within each round; ``both`` = the mean of the two torch copies in that round (paired,
    and neither copy's run-long offset favoured, see aa_ratio)."""
    ref = (rounds["torch"] + rounds["torch_b"]) / 2 if reference == "both" else rounds[reference]
    return (rounds[variant] / ref).to_numpy()


def summarize_point(samples: pd.DataFrame) -> dict:
    """Medians, paired ours/torch ratio with spread, ideal bounds and overhead of one point's samples."""
    rounds = _rounds(samples)
    lat = rounds.median()
    return dict(
        **_latency_ratios(rounds, lat), **_ideal_bounds(samples, lat), **_host_costs(samples), rounds=len(rounds)
    )


def _latency_ratios(rounds: pd.DataFrame, lat: pd.Series) -> dict:
    """Each variant's median latency and ours against torch: of the medians, per round, and their intervals."""
    paired = rounds["ours"] / rounds["torch"]  # same round: robust when the machine's load drifts between rounds
    paired_both = _per_round(rounds, "ours", "both")
    rng = np.random.default_rng(0)
    ratio_ci = ratio_of_medians_ci(rounds["ours"], rounds["torch"], rng)
    paired_ci, both_ci = bootstrap_median_ci(paired, rng), bootstrap_median_ci(paired_both, rng)
    return dict(
        ours_ms=lat["ours"],
        torch_ms=lat["torch"],
        ratio=lat["ours"] / lat["torch"],
        torch_b_ms=lat["torch_b"],
        aa_ratio=lat["torch_b"] / lat["torch"],
        ratio_both=lat["ours"] / ((lat["torch"] + lat["torch_b"]) / 2),
        ratio_p10=paired.quantile(0.1),
        ratio_p90=paired.quantile(0.9),
        ratio_ci_lo=ratio_ci[0],
        ratio_ci_hi=ratio_ci[1],
        paired_ratio=paired.median(),
        paired_ci_lo=paired_ci[0],
        paired_ci_hi=paired_ci[1],
        paired_both=np.median(paired_both),
        paired_both_ci_lo=both_ci[0],
        paired_both_ci_hi=both_ci[1],
        ours_notiming_ms=lat["ours_notiming"],
        timing_overhead_pct=(lat["ours"] / lat["ours_notiming"] - 1) * 100,
    )


def _ideal_bounds(samples: pd.DataFrame, lat: pd.Series) -> dict:
    """Each DDP against its ideal: its own forward and optimizer, and the longer of a local backward and the
    buckets' allreduce alone."""
    med = samples.groupby("variant")[["forward_ms", "backward_ms", "optimizer_ms"]].median()
    backward = max(med.loc["local", "backward_ms"], lat["allreduce"])
    ideal = {v: med.loc[v, "forward_ms"] + backward + med.loc[v, "optimizer_ms"] for v in ("ours", "torch")}
    return dict(
        forward_ms_ours=med.loc["ours", "forward_ms"],
        forward_ms_torch=med.loc["torch", "forward_ms"],
        optimizer_ms_ours=med.loc["ours", "optimizer_ms"],
        optimizer_ms_torch=med.loc["torch", "optimizer_ms"],
        local_backward_ms=med.loc["local", "backward_ms"],
        allreduce_ms=lat["allreduce"],
        local_ms=lat["local"],
        ideal_ms_ours=ideal["ours"],
        ideal_ms_torch=ideal["torch"],
        ours_vs_ideal=lat["ours"] / ideal["ours"],
        torch_vs_ideal=lat["torch"] / ideal["torch"],
    )


def _host_costs(samples: pd.DataFrame) -> dict:
    """What an iteration costs the host: CPU time and minor page faults, medians per variant."""
    cpu = samples.groupby("variant")["cpu_ms"].median()
    faults = samples.groupby("variant")["minor_faults"].median()
    return dict(
        cpu_ms_ours=cpu["ours"],
        cpu_ms_torch=cpu["torch"],
        cpu_ratio=cpu["ours"] / cpu["torch"],
        faults_ours=faults["ours"],
        faults_torch=faults["torch"],
        faults_torch_b=faults["torch_b"],
    )


def pooled(samples: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One number per model and comparison: its caps pooled (geometric mean of each point's median per-round
    ratio, experiments.stats), cap 0 (a bucket per gradient, what DDP pays per bucket) apart from the others.
    Comparisons: ours and ours_notiming against both torch copies, and the A/A control torch_b / torch (what no
    difference looks like)."""
    rng = np.random.default_rng(seed)
    rows = []
    regime = samples["model"].where(samples["bucket_cap_mb"] > 0, samples["model"] + PER_GRADIENT)
    for name, by_model in samples.groupby(regime, sort=False):
        points = [_rounds(g) for _, g in by_model.groupby("bucket_cap_mb")]
        for variant, reference in (("ours", "both"), ("ours_notiming", "both"), ("torch_b", "torch")):
            per_point = [_per_round(r, variant, reference) for r in points]
            est, lo, hi = pooled_geomean_ci(per_point, rng)
            against = "torch, torch_b" if reference == "both" else reference
            rows.append(
                dict(
                    model=name,
                    comparison=f"{variant} / {against}",
                    points=len(points),
                    rounds=sum(len(x) for x in per_point),
                    pooled_ratio=est,
                    ci_lo=lo,
                    ci_hi=hi,
                )
            )
    return pd.DataFrame(rows)
