"""ZeRO / FSDP / DeepSpeed beside DDP: runtime, memory per rank by category, traffic (beyond the paper).

    make zero                                   CPU default: Gloo, ResNet101 and BERT-base, 1, 2 and 4 ranks
    make zero ARGS="--models=resnet101 --world_sizes=2 --systems=torch,fsdp"
    make zero ARGS="--optimizer=sgd --checkpointing=true"

Every system (``harness/workloads/systems.py``) trains the same model from the same weights with the same optimizer and
inputs, timed by the same loop as the paper's figures; the 1-rank control is the model alone (``local``), the
other systems run at the larger world sizes. Each point also runs one iteration measuring its peak memory and
the bytes every rank sent, and one under ``torch.profiler``'s memory profile (``harness/workloads/memory.py``): the
categories at the peak, the state before forward (checked against ZeRO's formulas) and the timeline.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddp_impl import DEFAULT_BUCKET_CAP_MB, MIB
from experiments import common, plotting, verdicts
from experiments.figures import zero_panels
from experiments.figures.zero_panels import rank0, system_order, vs_torch
from experiments.figures.zero_theory import model_state_formula, state_bytes_per_param, traffic_formula
from harness import TrainConfig
from harness.config import auto_profile_backend
from harness.launch.env import threads_per_rank
from harness.workloads.models import input_spec
from harness.workloads.systems import ZERO_IMPLS

FIGURE = "zero"
PAPER = {
    "setup": "the DDP vs DeepSpeed ZeRO-3 study the suite serves: ResNet101, 1 (control), 2 and 4 workers",
    "claim": "ZeRO-3 is slower than DDP at 2 workers; its memory per rank falls roughly as 1/N",
}


@dataclass(frozen=True)
class Config(common.ModelSweep):
    """Systems x world sizes; every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet101", "bert-base")
    # torch (DDP) | zero1 | fsdp | fsdp_keep | deepspeed1 | deepspeed2 | deepspeed3 | threads
    # (harness/workloads/systems.py)
    systems: tuple[str, ...] = ("torch", *ZERO_IMPLS, "threads")
    world_sizes: tuple[int, ...] = (1, 2, 4)  # ranks: the systems at each above 1; local (the control) at every one
    backends: tuple[str, ...] = ("gloo",)
    optimizer: str = "adam"  # sgd | adam: Adam's two moments per parameter are the state ZeRO shards
    checkpointing: bool = False  # activation checkpointing per block, in every system
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB  # DDP's and DeepSpeed's bucket cap (MiB)
    iters: int = 5
    warmup: int = 1
    repeats: int = 2


def points(cfg: Config) -> list[TrainConfig]:
    """Per N (a world size): the control at N ranks, each system on N ranks, and DataParallel's design as N
    replicas in one process at the same global batch and total threads (``threads``)."""
    shared = dict(
        bucket_cap_mb=cfg.bucket_cap_mb, optimizer=cfg.optimizer, checkpointing=cfg.checkpointing, memory=True
    )
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
    ok = ok[
        ok["model"].isin(cfg.models)
        & ok["impl"].isin(("local", *cfg.systems))
        & (ok["optimizer"].fillna("sgd") == cfg.optimizer)
        & (ok["checkpointing"].fillna(False).astype(bool) == cfg.checkpointing)
        & ok["mem_measured_peak_bytes"].notna()
    ]
    replicas = ok.get("replicas", pd.Series(1, index=ok.index)).fillna(1).astype(int)
    return ok.assign(n=ok["world_size"] * replicas)  # ranks, or replicas in one process (threads)


# --------------------------------------------------------------------------- the figure (panels: zero_panels.py)


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
        zero_panels.runtime(axes[r][0], sel, model)
        zero_panels.memory(axes[r][1], sel, model, cfg.optimizer)
        zero_panels.timeline(axes[r][2], sel, model)
        zero_panels.traffic(axes[r][3], sel, model)
    note = (
        f". Optimizer {cfg.optimizer}{', activation checkpointing' if cfg.checkpointing else ''}. Runtime: "
        "all iterations pooled; below, each system's latency over torch DDP's at the same N, a dot per "
        "repetition, their median and 95% interval (square). Memory: rank 0's categories at its profiled peak "
        "(harness/workloads/memory.py). Traffic: bytes rank 0's namespace sent in one iteration"
    )
    return plotting.finish(
        fig,
        "DDP vs ZeRO / FSDP / DeepSpeed: runtime, memory per rank, traffic",
        f"{PAPER['setup']}; {PAPER['claim']}",
        ok,
        note,
    )


# --------------------------------------------------------------------------- the numbers


def table(df, cfg: Config) -> pd.DataFrame:
    """Per (model, system, N): latency (median over repetition medians, with its interval), rank 0's peak memory
    measured and profiled, model state against ZeRO's formula, and traffic against theory."""
    ok = _selected(df, cfg)
    if ok.empty:
        return pd.DataFrame()
    k = state_bytes_per_param(cfg.optimizer)
    per_repeat = verdicts.repeat_medians(ok, ["model", "impl", "n"])
    rows = []
    for (model, impl, n), s in per_repeat.groupby(level=[0, 1, 2]):
        r0 = rank0(ok[(ok["model"] == model) & (ok["impl"] == impl) & (ok["n"] == n)])
        params = int(r0["num_params"].max())
        measured, profiled = r0["mem_measured_peak_bytes"].median(), r0["mem_profiled_peak_bytes"].median()
        state, formula = r0["mem_model_state_bytes"].median(), model_state_formula(impl, params, int(n), k)
        sent, theory = r0["sent_bytes"].median(), traffic_formula(impl, params, int(n))
        rows.append(
            dict(
                model=model,
                impl=impl,
                world_size=int(n),
                latency=verdicts.spread(s.to_numpy()),
                measured_peak_mib=measured / MIB,
                profiled_peak_mib=profiled / MIB,
                categories_vs_measured_pct=100 * (profiled - measured) / measured if measured else np.nan,
                model_state_mib=state / MIB,
                formula_mib=formula / MIB,
                state_vs_formula_pct=100 * (state - formula) / formula,
                sent_mib=sent / MIB,
                theory_mib=theory / MIB,
                sent_vs_theory=sent / theory if theory else np.nan,
            )
        )
    out = pd.DataFrame(rows)
    order = system_order(out["impl"])
    return out.sort_values(
        ["model", "world_size", "impl"], key=lambda c: c.map(order.index) if c.name == "impl" else c
    ).reset_index(drop=True)


def summarize(df, cfg: Config) -> str:
    t = table(df, cfg)
    if t.empty:
        return "no results"
    lines = []
    for model, sel in t.groupby("model", sort=False):
        lines.append(
            f"{model} (optimizer {cfg.optimizer}; per rank: latency, peak memory measured | profiled "
            "categories, model state vs ZeRO's formula, traffic vs theory):"
        )
        for _, r in sel.iterrows():
            traffic = (
                f"sent {r.sent_mib:.0f} MiB = {r.sent_vs_theory:.2f}x theory"
                if np.isfinite(r.sent_vs_theory)
                else "no traffic"
            )
            lines.append(
                f"  {r.impl} N={r.world_size}: {r.latency.fmt()}; peak {r.measured_peak_mib:.0f} MiB | "
                f"{r.profiled_peak_mib:.0f} MiB ({r.categories_vs_measured_pct:+.0f}%); state "
                f"{r.model_state_mib:.0f} MiB vs {r.formula_mib:.0f} ({r.state_vs_formula_pct:+.0f}%); "
                f"{traffic}"
            )
        lines.append(memory_check(sel))
        lines += _verdicts(df, cfg, model)
    return "\n".join(lines)


def memory_check(t: pd.DataFrame, tolerance_pct: float = 10) -> str:
    """Whether the memory by category can be trusted, on rows of :func:`table`: do the profiled categories add up
    to the measured peak within ``tolerance_pct``? Names every point outside."""
    off = t[t["categories_vs_measured_pct"].abs() > tolerance_pct]
    outside = ", ".join(f"{r.impl} N={r.world_size} {r.categories_vs_measured_pct:+.0f}%" for r in off.itertuples())
    worst = t.loc[t["categories_vs_measured_pct"].abs().idxmax()]
    return (
        f"  memory categories vs the measured peak: within {tolerance_pct:g}% at {len(t) - len(off)} of {len(t)} "
        f"points (worst {worst.impl} N={worst.world_size} {worst.categories_vs_measured_pct:+.1f}%)"
        + (f"; outside: {outside}" if outside else "")
    )


def _verdicts(df, cfg: Config, model: str) -> list[str]:
    """The study's two claims: ZeRO-3 slower than DDP at 2 workers (paired ratio over repetitions), and ZeRO-3's
    memory per rank falling as 1/N (peak and model state from the fewest to the most ranks)."""
    ok = _selected(df, cfg)
    ok = ok[ok["model"] == model]
    ratios = vs_torch(ok)
    out = []
    for zero3 in ("deepspeed3", "fsdp"):
        if (zero3, 2) in ratios:
            ratio = verdicts.spread(ratios[zero3, 2])
            out.append(
                f"  claim 'ZeRO-3 slower than DDP at 2 workers' ({zero3} / torch DDP latency, N=2): "
                f"{ratio.fmt('x', 2)}: {verdicts.verdict(ratio, 1.0)}"
            )
        r0 = rank0(ok[ok["impl"] == zero3])
        sizes = sorted(r0["n"].unique())
        if len(sizes) >= 2:
            lo, hi = sizes[0], sizes[-1]
            state = r0.groupby("n")["mem_model_state_bytes"].median()
            peak = r0.groupby("n")["mem_measured_peak_bytes"].median()
            out.append(
                f"  claim 'ZeRO-3 memory per rank ~ 1/N' ({zero3}, N={lo} -> {hi}, 1/N predicts "
                f"{hi / lo:.1f}x less): model state {state[lo] / state[hi]:.2f}x less, whole peak "
                f"{peak[lo] / peak[hi]:.2f}x less (activations are not sharded)"
            )
    return out


if __name__ == "__main__":  # `python -m experiments.figures.zero ARGS` is `python -m experiments zero ARGS`
    from experiments.__main__ import main

    sys.exit(main(["zero", *sys.argv[1:]]))
