"""The panels of the ZeRO figure (``experiments/figures/zero.py``), a row per model: runtime with its ratio to
torch DDP, memory per rank by category at the peak, memory over one iteration, and traffic beside theory."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ddp_impl import MIB
from experiments import plotting, verdicts
from experiments.figures.zero_theory import TRAFFIC_UNITS, model_state_formula, state_bytes_per_param, traffic_formula
from harness.workloads.memory import CATEGORIES
from harness.workloads.systems import ZERO_IMPLS


def system_order(impls) -> list[str]:
    """The systems in ``impls``, the control and DDP first, then ZeRO's as ``ZERO_IMPLS`` lists them, others last."""
    known = ("local", "ours", "torch", *ZERO_IMPLS)
    return sorted(set(impls), key=lambda i: known.index(i) if i in known else len(known))


def rank0(sel: pd.DataFrame) -> pd.DataFrame:
    """One row per point: rank 0's memory and traffic columns (the same on every row of a rank)."""
    return sel[(sel["iteration"] == 0) & (sel["rank"] == 0)]


def _medians_mib(ranks: pd.DataFrame, pairs: list[tuple[str, int]], column: str) -> list[float]:
    return [ranks.loc[(ranks["impl"] == i) & (ranks["n"] == n), column].median() / MIB for i, n in pairs]


def _system_ticks(ax, pairs: list[tuple[str, int]], start: int = 0) -> None:
    """One upright label per bar or box, on one line: two lines turned upright take twice the room between ticks."""
    ax.set_xticks(range(start, start + len(pairs)), [f"{i} N={n}" for i, n in pairs], fontsize=6.5, rotation=90)


def _labels(sel: pd.DataFrame) -> list[tuple[str, int]]:
    pairs = {(i, int(n)) for i, n in zip(sel["impl"], sel["n"])}
    order = system_order(i for i, _ in pairs)
    return sorted(pairs, key=lambda p: (p[1], order.index(p[0])))


def runtime(ax, sel: pd.DataFrame, model: str) -> None:
    pairs = _labels(sel)
    boxes, lower = plotting.split_panel(ax)
    data = [sel.loc[(sel["impl"] == i) & (sel["n"] == n), "total_ms"] for i, n in pairs]
    boxes.boxplot(data, flierprops=dict(ms=2))
    boxes.set_title(f"{model}: per-iteration latency", fontsize=10)
    boxes.set_ylabel("ms")
    boxes.grid(axis="y", alpha=0.3)
    ratios = vs_torch(sel)  # the claim's statistic (zero._verdicts), for every system at every N with torch DDP
    drawn = [(x, pair) for x, pair in enumerate(pairs, start=1) if pair in ratios]
    if drawn:
        plotting.paired_panel(lower, {pair: ratios[pair] for _, pair in drawn}, [x for x, _ in drawn])
    lower.set_ylabel("latency / torch\nDDP's, paired")
    _system_ticks(lower, pairs, start=1)


def vs_torch(sel: pd.DataFrame) -> dict:
    """(system, N) -> its latency over torch DDP's at the same N, one ratio per repetition (``verdicts.paired_ratios``
    of repetition medians), for every system but torch at every N where torch DDP ran."""
    per_repeat = verdicts.repeat_medians(sel, ["impl", "n"])
    out = {}
    for n in sorted(set(per_repeat.index.get_level_values(1))):
        s = per_repeat.xs(n, level=1)
        if "torch" in s.index.get_level_values(0):
            out.update(
                {
                    (impl, int(n)): verdicts.paired_ratios(s, impl, "torch")
                    for impl in system_order(s.index.get_level_values(0))
                    if impl != "torch"
                }
            )
    return out


def memory(ax, sel: pd.DataFrame, model: str, optimizer: str) -> None:
    ranks = rank0(sel)
    pairs = _labels(ranks)
    k = state_bytes_per_param(optimizer)
    bottom = np.zeros(len(pairs))
    for c in CATEGORIES:
        median = _medians_mib(ranks, pairs, f"mem_{c}_bytes")
        ax.bar(range(len(pairs)), median, bottom=bottom, label=c.replace("_", " "))
        bottom += np.nan_to_num(median)
    measured = _medians_mib(ranks, pairs, "mem_measured_peak_bytes")
    ax.plot(range(len(pairs)), measured, "kx", ms=7, label="peak measured without profiler")
    params = ranks["num_params"].max()
    ax.plot(
        range(len(pairs)),
        [model_state_formula(i, params, n, k) / MIB for i, n in pairs],
        "o",
        mfc="none",
        color="k",
        label="ZeRO formula: model state",
    )
    _system_ticks(ax, pairs)
    ax.set_title(f"{model}: memory per rank at its peak", fontsize=10)
    ax.set_ylabel("MiB")
    ax.set_ylim(top=1.6 * np.nanmax([*bottom, *measured, 1]))  # room for the legend above the bars
    ax.legend(fontsize=6, ncol=2, loc="upper left")


def timeline(ax, sel: pd.DataFrame, model: str) -> None:
    ranks = rank0(sel)
    ranks = ranks[ranks["n"] == ranks["n"].max()]
    for impl in system_order(ranks["impl"]):
        row = ranks[ranks["impl"] == impl].iloc[0]
        series = np.array(json.loads(row["mem_timeline_json"] or "[]"), dtype=float)
        if len(series):
            ax.plot(series[:, 0] / series[-1, 0], series[:, 1:].sum(axis=1) / MIB, label=impl, lw=1)
    ax.set_title(f"{model}: memory over one iteration, N={int(ranks['n'].max())}, rank 0", fontsize=10)
    ax.set_xlabel("fraction of the profiled iteration")
    ax.set_ylabel("MiB (all categories)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)


def traffic(ax, sel: pd.DataFrame, model: str) -> None:
    ranks = rank0(sel)
    ranks = ranks[(ranks["n"] > 1) & ranks["impl"].isin(TRAFFIC_UNITS)]
    pairs = _labels(ranks)
    params = ranks["num_params"].max() if len(ranks) else 0
    ax.bar(range(len(pairs)), _medians_mib(ranks, pairs, "sent_bytes"), color="C0", label="measured")
    ax.plot(range(len(pairs)), [traffic_formula(i, params, n) / MIB for i, n in pairs], "kx", ms=7, label="theory")
    _system_ticks(ax, pairs)
    ax.set_title(f"{model}: bytes sent per rank per iteration", fontsize=10)
    ax.set_ylabel("MiB")
    ax.legend(fontsize=6)
