"""ZeRO / FSDP / DeepSpeed beside DDP: runtime, memory per rank by category, traffic (beyond the paper).

    make zero                                   CPU default: Gloo, ResNet101 and BERT-base, 1, 2 and 4 ranks
    make zero ARGS="--models=resnet101 --world_sizes=2 --systems=torch,fsdp"
    make zero ARGS="--optimizer=sgd --checkpointing=true"

Every system (``harness/systems.py``) trains the same model from the same weights with the same optimizer and
inputs, timed by the same loop as the paper's figures; the 1-rank control is the model alone (``local``), the
other systems run at the larger world sizes. Each point also runs one iteration measuring its peak memory and
the bytes every rank sent, and one under ``torch.profiler``'s memory profile (``harness/memory.py``): the
categories at the peak, the state before forward (checked against ZeRO's formulas) and the timeline.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from experiments import common, plotting, verdicts
from harness import TrainConfig
from harness.config import auto_profile_backend
from harness.env import threads_per_rank
from harness.memory import CATEGORIES
from harness.models import input_spec
from harness.systems import ZERO_IMPLS

FIGURE = "zero"
PAPER = {
    "setup": "the DDP vs DeepSpeed ZeRO-3 study the suite serves: ResNet101, 1 (control), 2 and 4 workers",
    "claim": "ZeRO-3 is slower than DDP at 2 workers; its memory per rank falls roughly as 1/N",
}
MIB = 2**20
ADAM_STATE_BYTES = 8  # K: two fp32 moments per parameter (plain SGD keeps none)


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """Systems x world sizes; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet101", "bert-base")
    # torch (DDP) | zero1 | fsdp | fsdp_keep | deepspeed1 | deepspeed2 | deepspeed3 | threads: harness/systems.py
    systems: tuple[str, ...] = ("torch", *ZERO_IMPLS, "threads")
    world_sizes: tuple[int, ...] = (1, 2, 4)  # ranks: the systems at each above 1; local (the control) at every one
    backends: tuple[str, ...] = ("gloo",)
    optimizer: str = "adam"  # sgd | adam: Adam's two moments per parameter are the state ZeRO shards
    checkpointing: bool = False  # activation checkpointing per block, in every system
    bucket_cap_mb: float = 25  # DDP's and DeepSpeed's bucket cap (MiB)
    iters: int = 5
    warmup: int = 1
    repeats: int = 2


def points(cfg: Config) -> list[TrainConfig]:
    """Per N (a world size): the control at N ranks, each system on N ranks, and DataParallel's design as N
    replicas in one process at the same global batch and total threads (``threads``)."""
    shared = dict(bucket_cap_mb=cfg.bucket_cap_mb, optimizer=cfg.optimizer, checkpointing=cfg.checkpointing,
                  memory=True)
    out = []
    for n in cfg.world_sizes:
        for impl in ("local", *cfg.systems) if n > 1 else ("local",):
            if impl != "threads":
                out += cfg.train_points(n, impl=impl, **shared)
                continue
            profile = auto_profile_backend(cfg.profile, "gloo")[0]
            for p in cfg.train_points(1, impl=impl, replicas=n, threads_per_rank=threads_per_rank(n), **shared):
                out.append(dataclasses.replace(p, batch_size=n * input_spec(p.model, profile).batch_size))
    return out


def _selected(df, cfg: Config) -> pd.DataFrame:
    ok = common.ok_rows(df, net=cfg.net, hosts=cfg.hosts)
    if ok.empty:
        return ok
    ok = ok[ok["model"].isin(cfg.models) & ok["impl"].isin(("local", *cfg.systems))
            & (ok["optimizer"].fillna("sgd") == cfg.optimizer)
            & (ok["checkpointing"].fillna(False).astype(bool) == cfg.checkpointing)
            & ok["mem_measured_peak_bytes"].notna()]
    replicas = ok.get("replicas", pd.Series(1, index=ok.index)).fillna(1).astype(int)
    return ok.assign(n=ok["world_size"] * replicas)  # ranks, or replicas in one process (threads)


def _order(impls) -> list[str]:
    known = ("local", "ours", "torch", *ZERO_IMPLS)
    return sorted(set(impls), key=lambda i: known.index(i) if i in known else len(known))


# --------------------------------------------------------------------------- theory

def model_state_formula(impl: str, params: int, world_size: int, k: int) -> float:
    """ZeRO's model-state bytes per rank in fp32: parameters, gradients, K bytes of optimizer state per parameter,
    each term divided by N where the system shards it (ZeRO paper, Section 5 with 4-byte weights and gradients).
    FSDP2 at rest is sharded like ZeRO-3 whether or not it reshards after forward. ``world_size`` is N (for
    ``threads``, its replicas)."""
    n, p = world_size, params
    if impl in ("zero1", "deepspeed1"):
        return 4 * p + 4 * p + k * p / n
    if impl == "deepspeed2":
        return 4 * p + (4 + k) * p / n
    if impl in ("fsdp", "fsdp_keep", "deepspeed3"):
        return (4 + 4 + k) * p / n
    if impl == "threads":  # N replicas' parameters in the one process, gradients summed into the first's
        return 4 * p * n + 4 * p + k * p
    return (4 + 4 + k) * p


# ring all-reduce sends 2 (N-1)/N of the gradient bytes per rank; all-gather, reduce-scatter, broadcast one each
TRAFFIC_UNITS = {"ours": 2, "torch": 2, "zero1": 3, "fsdp": 3, "fsdp_keep": 2, "deepspeed1": 2, "deepspeed2": 2,
                 "deepspeed3": 3}


def traffic_formula(impl: str, params: int, world_size: int) -> float:
    """Bytes a rank sends per iteration in theory: DDP one all-reduce (2 units of (N-1)/N x 4 bytes x params);
    ZeRO-1 adds the updated parameters' broadcast; ZeRO-3 all-gathers in forward and in backward and
    reduce-scatters (3 units, 1.5x DDP); FSDP without resharding gathers once; DeepSpeed 1/2 reduce-scatter and
    all-gather."""
    n = world_size
    return TRAFFIC_UNITS.get(impl, 0) * (n - 1) / n * 4 * params


# --------------------------------------------------------------------------- the figure

def _rank0(sel: pd.DataFrame) -> pd.DataFrame:
    """One row per point: rank 0's memory and traffic columns (the same on every row of a rank)."""
    return sel[(sel["iteration"] == 0) & (sel["rank"] == 0)]


def _state_bytes_per_param(cfg: Config) -> int:
    return ADAM_STATE_BYTES if cfg.optimizer == "adam" else 0


def _medians_mib(ranks: pd.DataFrame, pairs: list[tuple[str, int]], column: str) -> list[float]:
    return [ranks.loc[(ranks["impl"] == i) & (ranks["n"] == n), column].median() / MIB for i, n in pairs]


def _system_ticks(ax, pairs: list[tuple[str, int]], start: int = 0) -> None:
    """One upright label per bar or box, on one line: two lines turned upright take twice the room between ticks."""
    ax.set_xticks(range(start, start + len(pairs)), [f"{i} N={n}" for i, n in pairs], fontsize=6.5, rotation=90)


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    models = [m for m in cfg.models if (ok["model"] == m).any()] or list(cfg.models)
    cols = ["runtime", "memory", "timeline", "traffic"]
    fig, axes = plotting.grid(models, cols, width=4.6, height=4.2)  # room for the runtime's paired panel
    for r, model in enumerate(models):
        sel = ok[ok["model"] == model]
        if sel.empty:
            for ax in axes[r]:
                plotting.mark_unavailable(ax, f"no results for {model}")
            continue
        _runtime(axes[r][0], sel, model)
        _memory(axes[r][1], sel, model, cfg)
        _timeline(axes[r][2], sel, model)
        _traffic(axes[r][3], sel, model)
    note = (f". Optimizer {cfg.optimizer}{', activation checkpointing' if cfg.checkpointing else ''}. Runtime: "
            "all iterations pooled; below, each system's latency over torch DDP's at the same N, a dot per "
            "repetition, their median and 95% interval (square). Memory: rank 0's categories at its profiled peak "
            "(harness/memory.py). Traffic: bytes rank 0's namespace sent in one iteration")
    return plotting.finish(fig, "DDP vs ZeRO / FSDP / DeepSpeed: runtime, memory per rank, traffic",
                         f"{PAPER['setup']}; {PAPER['claim']}", ok, note)


def _labels(sel: pd.DataFrame) -> list[tuple[str, int]]:
    pairs = {(i, int(n)) for i, n in zip(sel["impl"], sel["n"])}
    order = _order(i for i, _ in pairs)
    return sorted(pairs, key=lambda p: (p[1], order.index(p[0])))


def _runtime(ax, sel: pd.DataFrame, model: str) -> None:
    pairs = _labels(sel)
    boxes, lower = plotting.split_panel(ax)
    data = [sel.loc[(sel["impl"] == i) & (sel["n"] == n), "total_ms"] for i, n in pairs]
    boxes.boxplot(data, flierprops=dict(ms=2))
    boxes.set_title(f"{model}: per-iteration latency", fontsize=10)
    boxes.set_ylabel("ms")
    boxes.grid(axis="y", alpha=0.3)
    ratios = _vs_torch(sel)  # the claim's statistic (_verdicts), for every system at every N with torch DDP
    drawn = [(x, pair) for x, pair in enumerate(pairs, start=1) if pair in ratios]
    if drawn:
        plotting.paired_panel(lower, {pair: ratios[pair] for _, pair in drawn}, [x for x, _ in drawn])
    lower.set_ylabel("latency / torch\nDDP's, paired")
    _system_ticks(lower, pairs, start=1)


def _vs_torch(sel: pd.DataFrame) -> dict:
    """(system, N) -> its latency over torch DDP's at the same N, one ratio per repetition (``verdicts.paired_ratios``
    of repetition medians), for every system but torch at every N where torch DDP ran."""
    per_repeat = verdicts.repeat_medians(sel, ["impl", "n"])
    out = {}
    for n in sorted(set(per_repeat.index.get_level_values(1))):
        s = per_repeat.xs(n, level=1)
        if "torch" in s.index.get_level_values(0):
            out.update({(impl, int(n)): verdicts.paired_ratios(s, impl, "torch")
                        for impl in _order(s.index.get_level_values(0)) if impl != "torch"})
    return out


def _memory(ax, sel: pd.DataFrame, model: str, cfg: Config) -> None:
    ranks = _rank0(sel)
    pairs = _labels(ranks)
    k = _state_bytes_per_param(cfg)
    bottom = np.zeros(len(pairs))
    for c in CATEGORIES:
        median = _medians_mib(ranks, pairs, f"mem_{c}_bytes")
        ax.bar(range(len(pairs)), median, bottom=bottom, label=c.replace("_", " "))
        bottom += np.nan_to_num(median)
    measured = _medians_mib(ranks, pairs, "mem_measured_peak_bytes")
    ax.plot(range(len(pairs)), measured, "kx", ms=7, label="peak measured without profiler")
    params = ranks["num_params"].max()
    ax.plot(range(len(pairs)), [model_state_formula(i, params, n, k) / MIB for i, n in pairs], "o", mfc="none",
            color="k", label="ZeRO formula: model state")
    _system_ticks(ax, pairs)
    ax.set_title(f"{model}: memory per rank at its peak", fontsize=10)
    ax.set_ylabel("MiB")
    ax.set_ylim(top=1.6 * np.nanmax([*bottom, *measured, 1]))  # room for the legend above the bars
    ax.legend(fontsize=6, ncol=2, loc="upper left")


def _timeline(ax, sel: pd.DataFrame, model: str) -> None:
    ranks = _rank0(sel)
    ranks = ranks[ranks["n"] == ranks["n"].max()]
    for impl in _order(ranks["impl"]):
        row = ranks[ranks["impl"] == impl].iloc[0]
        series = np.array(json.loads(row["mem_timeline_json"] or "[]"), dtype=float)
        if len(series):
            ax.plot(series[:, 0] / series[-1, 0], series[:, 1:].sum(axis=1) / MIB, label=impl, lw=1)
    ax.set_title(f"{model}: memory over one iteration, N={int(ranks['n'].max())}, rank 0", fontsize=10)
    ax.set_xlabel("fraction of the profiled iteration")
    ax.set_ylabel("MiB (all categories)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)


def _traffic(ax, sel: pd.DataFrame, model: str) -> None:
    ranks = _rank0(sel)
    ranks = ranks[(ranks["n"] > 1) & ranks["impl"].isin(TRAFFIC_UNITS)]
    pairs = _labels(ranks)
    params = ranks["num_params"].max() if len(ranks) else 0
    ax.bar(range(len(pairs)), _medians_mib(ranks, pairs, "sent_bytes"), color="C0", label="measured")
    ax.plot(range(len(pairs)), [traffic_formula(i, params, n) / MIB for i, n in pairs], "kx", ms=7, label="theory")
    _system_ticks(ax, pairs)
    ax.set_title(f"{model}: bytes sent per rank per iteration", fontsize=10)
    ax.set_ylabel("MiB")
    ax.legend(fontsize=6)


# --------------------------------------------------------------------------- the numbers

def table(df, cfg: Config) -> pd.DataFrame:
    """Per (model, system, N): latency (median over repetition medians, with its interval), rank 0's peak memory
    measured and profiled, model state against ZeRO's formula, and traffic against theory."""
    ok = _selected(df, cfg)
    if ok.empty:
        return pd.DataFrame()
    k = _state_bytes_per_param(cfg)
    per_repeat = verdicts.repeat_medians(ok, ["model", "impl", "n"])
    rows = []
    for (model, impl, n), s in per_repeat.groupby(level=[0, 1, 2]):
        r0 = _rank0(ok[(ok["model"] == model) & (ok["impl"] == impl) & (ok["n"] == n)])
        params = int(r0["num_params"].max())
        measured, profiled = r0["mem_measured_peak_bytes"].median(), r0["mem_profiled_peak_bytes"].median()
        state, formula = r0["mem_model_state_bytes"].median(), model_state_formula(impl, params, int(n), k)
        sent, theory = r0["sent_bytes"].median(), traffic_formula(impl, params, int(n))
        rows.append(dict(model=model, impl=impl, world_size=int(n), latency=verdicts.spread(s.to_numpy()),
                         measured_peak_mib=measured / MIB, profiled_peak_mib=profiled / MIB,
                         categories_vs_measured_pct=100 * (profiled - measured) / measured if measured else np.nan,
                         model_state_mib=state / MIB, formula_mib=formula / MIB,
                         state_vs_formula_pct=100 * (state - formula) / formula,
                         sent_mib=sent / MIB, theory_mib=theory / MIB,
                         sent_vs_theory=sent / theory if theory else np.nan))
    out = pd.DataFrame(rows)
    order = _order(out["impl"])
    return out.sort_values(["model", "world_size", "impl"], key=lambda c: c.map(order.index) if c.name == "impl"
                           else c).reset_index(drop=True)


def summarize(df, cfg: Config) -> str:
    t = table(df, cfg)
    if t.empty:
        return "no results"
    lines = []
    for model, sel in t.groupby("model", sort=False):
        lines.append(f"{model} (optimizer {cfg.optimizer}; per rank: latency, peak memory measured | profiled "
                     "categories, model state vs ZeRO's formula, traffic vs theory):")
        for _, r in sel.iterrows():
            traffic = (f"sent {r.sent_mib:.0f} MiB = {r.sent_vs_theory:.2f}x theory" if np.isfinite(r.sent_vs_theory)
                       else "no traffic")
            lines.append(f"  {r.impl} N={r.world_size}: {r.latency.fmt()}; peak {r.measured_peak_mib:.0f} MiB | "
                         f"{r.profiled_peak_mib:.0f} MiB ({r.categories_vs_measured_pct:+.0f}%); state "
                         f"{r.model_state_mib:.0f} MiB vs {r.formula_mib:.0f} ({r.state_vs_formula_pct:+.0f}%); "
                         f"{traffic}")
        lines.append(memory_check(sel))
        lines += _verdicts(df, cfg, model)
    return "\n".join(lines)


def memory_check(t: pd.DataFrame, tolerance_pct: float = 10) -> str:
    """Whether the memory by category can be trusted, on rows of :func:`table`: do the profiled categories add up
    to the measured peak within ``tolerance_pct``? Names every point outside."""
    off = t[t["categories_vs_measured_pct"].abs() > tolerance_pct]
    outside = ", ".join(f"{r.impl} N={r.world_size} {r.categories_vs_measured_pct:+.0f}%" for r in off.itertuples())
    worst = t.loc[t["categories_vs_measured_pct"].abs().idxmax()]
    return (f"  memory categories vs the measured peak: within {tolerance_pct:g}% at {len(t) - len(off)} of {len(t)} "
            f"points (worst {worst.impl} N={worst.world_size} {worst.categories_vs_measured_pct:+.1f}%)"
            + (f"; outside: {outside}" if outside else ""))


def _verdicts(df, cfg: Config, model: str) -> list[str]:
    """The study's two claims: ZeRO-3 slower than DDP at 2 workers (paired ratio over repetitions), and ZeRO-3's
    memory per rank falling as 1/N (peak and model state from the fewest to the most ranks)."""
    ok = _selected(df, cfg)
    ok = ok[ok["model"] == model]
    vs_torch = _vs_torch(ok)
    out = []
    for zero3 in ("deepspeed3", "fsdp"):
        if (zero3, 2) in vs_torch:
            ratio = verdicts.spread(vs_torch[zero3, 2])
            out.append(f"  claim 'ZeRO-3 slower than DDP at 2 workers' ({zero3} / torch DDP latency, N=2): "
                       f"{ratio.fmt('x', 2)}: {verdicts.verdict(ratio, 1.0)}")
        r0 = _rank0(ok[ok["impl"] == zero3])
        sizes = sorted(r0["n"].unique())
        if len(sizes) >= 2:
            lo, hi = sizes[0], sizes[-1]
            state = r0.groupby("n")["mem_model_state_bytes"].median()
            peak = r0.groupby("n")["mem_measured_peak_bytes"].median()
            out.append(f"  claim 'ZeRO-3 memory per rank ~ 1/N' ({zero3}, N={lo} -> {hi}, 1/N predicts "
                       f"{hi / lo:.1f}x less): model state {state[lo] / state[hi]:.2f}x less, whole peak "
                       f"{peak[lo] / peak[hi]:.2f}x less (activations are not sharded)")
    return out


if __name__ == "__main__":  # `python -m experiments.zero ARGS` is `python -m experiments zero ARGS`
    from experiments.__main__ import main

    sys.exit(main(["zero", *sys.argv[1:]]))
