"""``bucket_cap_mb="auto"`` measured: ours finding its cap while it trains, beside every fixed cap of a sweep.

    make autotune                                   ResNet50 and BERT-base, 2 ranks, net=auto (~12 min on 2 cores)
    make autotune ARGS="--nets=auto,1gbit --skip=bert-base@1gbit"     BENCHMARKS.md's run (~18 min)
    python -m experiments autotune --help

Per model and link, each repetition trains ours with ``bucket_cap_mb="auto"`` (``ddp_impl.autotune``: the point
trains until the search settles, then measures like any point) and ours at every fixed cap of ``caps_mb``, the points
of a repetition in an interleaved order. Reported: the caps the search settled on, the iterations until settled, the
settled latency over the best fixed cap's as a paired ratio across repetitions with its interval, torch's default
cap (25 MiB) over the best likewise, and what tuning cost: from the search's own log, its trials' time beyond as many
iterations at the cap it settled on. Writes ``results/autotune/summary.csv`` and ``results/figures/autotune.png``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from ddp_impl.cap_search import WARMUP_ITERS
from experiments import common, plotting
from experiments.common import is_auto
from experiments.stats import bootstrap_median_ci, ratio_of_medians_ci
from harness import TrainConfig, parse_dataclass, run_sweep
from harness.config import validate
from harness.launch.errors import command_line, refusing
from harness.preflight import preflight
from harness.results import results_root

EXPERIMENT = "autotune"
DEFAULT_CAP_MB = float(DEFAULT_BUCKET_CAP_MB)


@dataclass(frozen=True)
class Config:
    """Every field is a --key=value override."""

    models: tuple[str, ...] = ("resnet50", "bert-base")  # harness.workloads.models
    nets: tuple[str, ...] = ("auto",)  # the link per rank: RATE (e.g. 1gbit) | auto | loopback (harness/README.md)
    skip: tuple[str, ...] = ()  # MODEL@NET pairs of models x nets left out (e.g. bert-base@1gbit)
    world_size: int = 2  # ranks
    caps_mb: tuple[float, ...] = (1, 5, 25, 100)  # fixed caps (MiB) measured beside the search
    repeats: int = 3  # interleaved repetitions of every point
    # the search's prior: "simulator" (this machine's calibration, stored or probed now, orders the caps of
    # make tune's grid by predicted latency), caps best first (e.g. "5,10"), or "" (a coarse-to-fine search)
    prior_mb: str = ""
    iters: int = 6  # measured iterations of every point per repetition
    # glibc's allocator in the ranks (harness/README.md): retain keeps freed memory, so no point pays page faults.
    # With the default, the search's own relayouts leave the allocator in another state than a fixed cap's point
    # has (BERT-base: no fault per iteration after them, ~70,000 without), which is not the cap's doing
    malloc: str = "retain"
    warmup: int = 3  # iterations run before measuring the tuning point, once its search has settled
    # iterations run before measuring a fixed-cap point: more than warmup, as the tuning point has trained through
    # its search (up to 30 iterations) before it is measured, and a warmer process reads faster
    warmup_fixed: int = 15


def priors(cfg: Config) -> dict[tuple[str, str], str]:
    """The search's prior per (model, net): ``prior_mb`` as given, or with "simulator" the caps ordered by the
    calibrated simulator's regret (``make tune``'s recommendation first)."""
    if cfg.prior_mb != "simulator":
        return {(m, n): cfg.prior_mb for m in cfg.models for n in cfg.nets}
    from experiments.tools.calibrations import calibration_for
    from experiments.tools.tune import Config as TuneConfig
    from simulator.model.recommend import recommend

    out = {}
    for model in cfg.models:
        for net in cfg.nets:
            cal, _ = calibration_for(TrainConfig(model=model, impl="ours", world_size=cfg.world_size, net=net))
            rec = recommend(cal, TuneConfig.grid_mb)
            order = sorted(rec.regret, key=lambda c: (rec.regret[c], rec.predicted_ms[c]))
            out[model, net] = ",".join(f"{c:g}" for c in order)
    return out


def points(cfg: Config, prior: dict[tuple[str, str], str]) -> list[TrainConfig]:
    """Every point, checked (ValueError naming the first bad setting)."""
    if cfg.repeats < 2:
        raise ValueError(f"repeats={cfg.repeats}: a paired interval needs at least 2 repetitions")
    unknown = set(cfg.skip) - {f"{m}@{n}" for m in cfg.models for n in cfg.nets}
    if unknown:
        raise ValueError(f"skip={','.join(sorted(unknown))}: not a MODEL@NET pair of models x nets")
    out = []
    for r in range(cfg.repeats):
        for model in cfg.models:
            for net in cfg.nets:
                if f"{model}@{net}" in cfg.skip:
                    continue
                base = TrainConfig(model=model, impl="ours", world_size=cfg.world_size, net=net, repeat=r)
                base = dataclasses.replace(base, warmup=cfg.warmup, iters=cfg.iters, malloc=cfg.malloc)
                out.append(dataclasses.replace(base, bucket_cap_mb="auto", autotune_prior_mb=prior[model, net]))
                out += [dataclasses.replace(base, bucket_cap_mb=float(c), warmup=cfg.warmup_fixed) for c in cfg.caps_mb]
    return [validate(p) for p in out]


def run(cfg: Config, root=None) -> pd.DataFrame:
    with refusing():
        points(cfg, {(m, n): "" for m in cfg.models for n in cfg.nets})  # every setting checked before a probe
        prior = priors(cfg)
        todo = points(cfg, prior)
        preflight(todo)
    ok = common.ok_rows(run_sweep(EXPERIMENT, todo, root=root))  # every stored point: keep this run's settings
    auto = is_auto(ok)
    wanted = pd.Series([prior.get(k) for k in zip(ok["model"], ok["net"])], index=ok.index)
    mine = auto & (ok["autotune_prior_mb"].fillna("") == wanted) & (ok["warmup"] == cfg.warmup)
    mine |= ok["bucket_cap_mb"].isin(cfg.caps_mb) & (ok["warmup"] == cfg.warmup_fixed)
    mine &= (ok["iters"] == cfg.iters) & (ok["malloc"] == cfg.malloc) & ~(ok["model"] + "@" + ok["net"]).isin(cfg.skip)
    return ok[mine & ok["model"].isin(cfg.models) & ok["net"].isin(cfg.nets) & (ok["world_size"] == cfg.world_size)]


def searches(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per tuning point (model, net, repeat): what its search settled on and its log (rank 0's last row), and
    the iterations and wall ms it took until settled (the slower rank's)."""
    tuned = ok[is_auto(ok)]
    took = tuned.groupby(["model", "net", "repeat"])[["autotune_iterations", "autotune_ms"]].max()
    rows = []
    for _, r in tuned[(tuned["rank"] == 0) & (tuned["autotune_json"].fillna("") != "")].iterrows():
        search = json.loads(r["autotune_json"])
        key = (r["model"], r["net"], r["repeat"])
        rows.append(
            dict(
                model=r["model"],
                net=r["net"],
                repeat=int(r["repeat"]),
                prior=r["autotune_prior_mb"] if pd.notna(r["autotune_prior_mb"]) and r["autotune_prior_mb"] else "",
                log=pd.DataFrame(search["log"], columns=["iteration", "cap_mb", "ms"]),
                settle_iterations=int(took.loc[key, "autotune_iterations"]),
                settle_ms=float(took.loc[key, "autotune_ms"]),
                **search["result"],
            )
        )
    return pd.DataFrame(rows)


def repeat_latencies(ok: pd.DataFrame) -> pd.DataFrame:
    """Per (model, net, repeat): the median ms of each fixed cap's point and of the tuning point (settled)."""
    auto = is_auto(ok)
    both = ok.assign(cap=ok["bucket_cap_mb"].astype(object).where(~auto, "auto"))
    return both.groupby(["model", "net", "repeat", "cap"])["total_ms"].median().unstack("cap")


def summary(ok: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per model and link: the search's outcome beside the best fixed cap and torch's default (module docstring).
    Columns: model, net, rate_mbit, repeats, prior, settled_caps (one per repetition), iterations_max, best_fixed_mb,
    best_fixed_ms, settled_ms, settled_vs_best and default_vs_best (each with _lo and _hi: 95% over repetitions,
    paired), tuning_extra_ms (with _lo, _hi), tuning_extra_iters, warmth (the tuning point settled on 25 MiB over
    the fixed 25 MiB point, over the repetitions that settled there: what being measured later is worth; NaN if
    none did), git_commit."""
    lat, found = repeat_latencies(ok), searches(ok)
    rng, rows = np.random.default_rng(seed), []
    for (model, net), per in lat.groupby(level=["model", "net"]):
        fixed = per.drop(columns="auto")
        best = fixed.median().idxmin()
        mine = found[(found["model"] == model) & (found["net"] == net)]
        rows_here = ok[(ok["model"] == model) & (ok["net"] == net)]
        settled, best_ms = per["auto"].to_numpy(), per[best].to_numpy()
        rows.append(
            dict(
                model=model,
                net=net,
                rate_mbit=float(rows_here["net_rate_mbit"].median()),
                repeats=len(per),
                prior=" | ".join(sorted(set(mine["prior"]))) or "coarse-to-fine",
                settled_caps=" ".join(f"{c:g}" for c in mine.sort_values("repeat")["cap_mb"]),
                iterations_max=int(mine["iterations"].max()),
                best_fixed_mb=best,
                best_fixed_ms=float(np.median(best_ms)),
                settled_ms=float(np.median(settled)),
                **_ratio("settled_vs_best", settled, best_ms, rng),
                **_ratio("default_vs_best", per[DEFAULT_CAP_MB].to_numpy(), best_ms, rng),
                **_tuning_cost(mine, per[best], rng),
                warmth=_warmth(per, mine),
                git_commit=" ".join(sorted(set(rows_here["git_commit"].dropna()))),
            )
        )
    return pd.DataFrame(rows)


def _warmth(per: pd.DataFrame, mine: pd.DataFrame) -> float:
    at_default = mine.loc[mine["cap_mb"] == DEFAULT_CAP_MB, "repeat"].to_numpy()
    both = per.droplevel(["model", "net"]).reindex(at_default)
    return float(np.median(both["auto"] / both[DEFAULT_CAP_MB])) if len(both) else float("nan")


def _ratio(name: str, a, b, rng) -> dict:
    lo, hi = ratio_of_medians_ci(a, b, rng)
    return {name: float(np.median(a) / np.median(b)), f"{name}_lo": lo, f"{name}_hi": hi}


def _tuning_cost(mine: pd.DataFrame, best: pd.Series, rng) -> dict:
    """Per repetition, the time until settled beyond as many iterations at that repetition's best fixed cap (median
    and interval over repetitions; also in iterations' worth)."""
    at_best = best.droplevel(["model", "net"]).reindex(mine["repeat"]).to_numpy()
    timed = mine["settle_iterations"].to_numpy() - WARMUP_ITERS  # the runner times the search's own iterations
    extra = mine["settle_ms"].to_numpy() - timed * at_best
    lo, hi = bootstrap_median_ci(extra, rng)
    med = float(np.median(extra))
    return dict(
        tuning_extra_ms=med, tuning_extra_ms_lo=lo, tuning_extra_ms_hi=hi, tuning_extra_iters=med / best.median()
    )


def plot(ok: pd.DataFrame, table: pd.DataFrame, root=None):
    """Per model and link: the caps the search tried over iterations (every repetition), and the settled latency
    beside every fixed cap's."""
    import matplotlib.pyplot as plt

    pairs = list(table[["model", "net"]].itertuples(index=False))
    fig, axes = plt.subplots(len(pairs), 2, figsize=(11, 3.2 * len(pairs)), squeeze=False)
    lat, found = repeat_latencies(ok), searches(ok)
    for (model, net), (left, right) in zip(pairs, axes):
        _trials_panel(left, found[(found["model"] == model) & (found["net"] == net)], model, net)
        _latency_panel(right, lat.xs((model, net), level=["model", "net"]), model, net)
    plotting.finish(fig, "bucket_cap_mb='auto': the search and where it settles", "", ok)
    return plotting.save(fig, EXPERIMENT, root)


def _trials_panel(ax, found: pd.DataFrame, model: str, net: str) -> None:
    for k, r in enumerate(found.sort_values("repeat").itertuples(index=False)):
        x = [*r.log["iteration"], r.iterations]
        y = [*r.log["cap_mb"], r.cap_mb]
        ax.step(
            x, np.clip(y, 1e-3, None), where="post", color=f"C{k}", label=f"repetition {r.repeat}: {r.cap_mb:g} MiB"
        )
    ax.set(yscale="log", xlabel="synchronized iteration", ylabel="bucket cap (MiB; 0 drawn at 0.001)")
    ax.set_title(f"{model}, net={net}: caps tried, then settled", fontsize=10)
    ax.legend(fontsize=7)


def _latency_panel(ax, per: pd.DataFrame, model: str, net: str) -> None:
    names = [c for c in per.columns if c != "auto"] + ["auto"]
    ax.boxplot([per[c].dropna().to_numpy() for c in names], tick_labels=[f"{c:g}" if c != "auto" else c for c in names])
    ax.set(xlabel="bucket cap (MiB); auto = settled iterations", ylabel="ms per iteration (repetition medians)")
    ax.set_title(f"{model}, net={net}: settled vs fixed caps", fontsize=10)


def format_table(table: pd.DataFrame) -> str:
    lines = []
    for r in table.itertuples(index=False):
        lines.append(
            f"{r.model} net={r.net}: settled on {r.settled_caps} MiB by iteration {r.iterations_max} at most; "
            f"settled / best fixed ({r.best_fixed_mb:g} MiB) x{r.settled_vs_best:.3f} "
            f"[{r.settled_vs_best_lo:.3f}, {r.settled_vs_best_hi:.3f}]; 25 MiB / best x{r.default_vs_best:.3f} "
            f"[{r.default_vs_best_lo:.3f}, {r.default_vs_best_hi:.3f}]; tuning cost {r.tuning_extra_ms:.0f} ms "
            f"({r.tuning_extra_iters:.2f} iterations' worth) over {r.repeats} repetitions; settled at 25 MiB / "
            f"fixed 25 MiB x{r.warmth:.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    prog = "python -m experiments autotune"

    def body() -> int:
        cfg = parse_dataclass(Config, argv, prog=prog)
        ok = run(cfg)
        table = summary(ok)
        out = results_root() / EXPERIMENT / "summary.csv"
        table.to_csv(out, index=False, lineterminator="\n")
        print(format_table(table))
        print(f"wrote {out} and {plot(ok, table)}")
        return 0

    return command_line(prog, body)


if __name__ == "__main__":
    sys.exit(main())
