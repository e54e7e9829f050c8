"""``make report``'s regions on DDP's cost (bench, memory, ideal bound, bucket cost, gpu-check) and the machines
that measured it; results measured by a ``ddp_impl`` other than this tree's are marked so."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd

from experiments.tools.bench_stats import PER_GRADIENT
from harness.results import REFERENCE
from harness.results import REPO_ROOT as ROOT

# ddp_impl's modules that run only with bucket_cap_mb="auto": a change to them leaves a fixed cap's results current
AUTO_ONLY = {"autotune.py", "cap_search.py"}


def _stale(commits: pd.Series, auto: bool = False) -> str:
    """A closing line when the rows' ``ddp_impl`` is not today's; '' when it is."""
    since = _ddp_impl_since(commits.dropna(), auto)
    return f"\n\n**All of the above**: {since}." if since else ""


def _ddp_impl_since(commits, auto: bool = False) -> str:
    """How the ``ddp_impl`` that measured (commits) differs from the one in this working tree: "" when the same.
    Without ``auto`` (results of fixed caps only) the modules of :data:`AUTO_ONLY` do not count."""
    changed = set()
    for commit in {c.removesuffix("+dirty") for c in commits}:  # a tree with changes: compared from its commit
        done = subprocess.run(
            ["git", "diff", "--name-only", commit, "--", "ddp_impl"], cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode != 0:
            return "measured by code that is not in this clone's history"
        changed |= {Path(p).name for p in done.stdout.split()} - (set() if auto else AUTO_ONLY)
    return f"measured with an earlier `ddp_impl` ({', '.join(sorted(changed))} changed since)" if changed else ""


_BENCH_RUNS = {"": "", "retain": "freed memory retained"}


def bench(folders=("", "retain")) -> str:
    """``make bench``'s pooled ratios per model (ours, ours with its timing off, and the A/A: all against torch's
    DDP) and ours / torch per cap, from each of ``folders`` under ``results/reference/bench/``."""
    rows = [
        "| model | run | caps x rounds | ours / torch | timing off | A/A | per cap (MiB: ratio) |",
        "|---|---|---|---|---|---|---|",
    ]
    stale = []
    for folder in folders:
        pooled = pd.read_csv(REFERENCE / "bench" / folder / "pooled.csv")
        points = pd.read_csv(REFERENCE / "bench" / folder / "summary.csv")
        since = _ddp_impl_since(points["git_commit"].dropna())
        if since:
            stale.append(f"**{(_BENCH_RUNS.get(folder, folder) or 'the default run').capitalize()}**: {since}.")
        for model, g in pooled.groupby("model", sort=False):
            ratio = {
                r.comparison.split(" /")[0]: f"{r.pooled_ratio:.3f} [{r.ci_lo:.3f}, {r.ci_hi:.3f}]"
                for r in g.itertuples()
            }
            base = model.removesuffix(PER_GRADIENT)
            mine = points[(points["model"] == base) & ((points["bucket_cap_mb"] == 0) == (model != base))]
            caps = ", ".join(f"{r.bucket_cap_mb:g}: {r.paired_ratio:.3f}" for r in mine.itertuples())
            rows.append(
                f"| {model} | {_BENCH_RUNS.get(folder, folder)} | {g['points'].iloc[0]} x "
                f"{g['rounds'].iloc[0] // g['points'].iloc[0]} | **{ratio['ours']}** | "
                f"{ratio['ours_notiming']} | {ratio['torch_b']} | {caps} |"
            )
    return "\n".join(rows) + "".join(f"\n\n{s}" for s in stale)


def bucket_cost() -> str:
    """``python -m experiments bucket-cost``: each DDP's cost per bucket, and ours's path step by step."""
    where = REFERENCE / "bucket_cost"
    per, steps = pd.read_csv(where / "per_bucket.csv"), pd.read_csv(where / "steps.csv")
    rows = [
        "| ranks | DDP | us per added bucket [95% CI] | us over no DDP, per bucket | iteration / torch's, a bucket "
        "per gradient [95% CI] | iteration / the floor's [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {r.world_size} | {r.ddp} | {r.us_per_bucket:.2f} [{r.ci_lo:.2f}, {r.ci_hi:.2f}] | "
        f"{r.us_over_local_per_bucket:.2f} | {r.over_torch:.3f} [{r.over_torch_lo:.3f}, {r.over_torch_hi:.3f}] | "
        f"{r.over_floor:.3f} [{r.over_floor_lo:.3f}, {r.over_floor_hi:.3f}] |"
        for r in per.itertuples()
    ]
    table = ["| ranks | step, alone | us per bucket [95% CI] |", "|---|---|---|"]
    table += [
        f"| {r.world_size} | {r.step} | {r.us_per_bucket:.2f} [{r.ci_lo:.2f}, {r.ci_hi:.2f}] |"
        for r in steps[steps["world_size"] == 1].itertuples()
    ]  # at 2 ranks the floor is the link's
    return (
        "\n".join(rows) + "\n\n" + "\n".join(table) + f"\n\n{per['model'].iloc[0]}, {per['buckets'].iloc[0]} "
        "buckets at cap 0." + _stale(per["git_commit"])
    )


def autotune() -> str:
    """``make autotune``'s summary: where the search settled, against the best fixed cap and torch's default."""
    t = pd.read_csv(REFERENCE / "autotune" / "summary.csv")
    rows = [
        "| model | link, Mbit/s per rank | settled on (MiB, per repetition) | iterations until settled, at most | "
        f"settled / best fixed cap ({t['repeats'].max()} repetitions) | torch's 25 MiB / best | "
        "what tuning cost, ms (iterations' worth) | settled at 25 MiB / fixed 25 MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in t.itertuples(index=False):
        rate = "loopback" if pd.isna(r.rate_mbit) else f"{r.net}, {r.rate_mbit:.0f}"
        rows.append(
            f"| {r.model} | {rate} | {r.settled_caps} | {r.iterations_max} | **{r.settled_vs_best:.3f} "
            f"[{r.settled_vs_best_lo:.3f}, {r.settled_vs_best_hi:.3f}]** (best: {r.best_fixed_mb:g} MiB) | "
            f"{r.default_vs_best:.3f} [{r.default_vs_best_lo:.3f}, {r.default_vs_best_hi:.3f}] | "
            f"{r.tuning_extra_ms:.0f} [{r.tuning_extra_ms_lo:.0f}, {r.tuning_extra_ms_hi:.0f}] "
            f"({r.tuning_extra_iters:.1f}) | {'' if pd.isna(r.warmth) else f'{r.warmth:.3f}'} |"
        )
    return "\n".join(rows) + _stale(t["git_commit"].str.split().explode(), auto=True)


def gpu_check() -> str:
    """The stored summary of ``make gpu-check`` (written by it on the GPU machine): the parity verdict, the bench per
    point and ``predict`` beside fig7; its headings demoted."""
    text = (REFERENCE / "gpu-check" / "summary.md").read_text()
    head, *sections = re.split(r"^## ", text.strip(), flags=re.M)
    kept = [head.replace("# gpu-check: ", "On ").strip()]
    for section in sections:
        title, _, body = section.partition("\n")
        tables = [t.strip() for t in re.split(r"\n\s*\n", body) if t.strip()]
        if title.startswith("1."):
            kept.append(f"**{title}**: {tables[-1].strip('*')} ({len(tables[0].splitlines()) - 2} cases).")
        elif title.startswith(("2.", "4.")):
            kept.append(f"**{title}**\n\n{tables[0]}")
    bench_rows = pd.read_csv(REFERENCE / "gpu-check" / "bench" / "summary.csv")
    return "\n\n".join(kept) + _stale(bench_rows["git_commit"])


def memory() -> str:
    """``make bench``'s memory per rank above the model and inputs (``memory.csv``)."""
    m = pd.read_csv(REFERENCE / "bench" / "memory.csv")
    m = m[m["variant"] != "local"]
    rows = [
        "| model (parameters) | DDP | steady-state extra MB, no view / `gradient_as_bucket_view` | startup peak MB, "
        "no view / view |",
        "|---|---|---|---|",
    ]
    for (model, variant), g in m.groupby(["model", "variant"], sort=False):
        g = g.set_index("gradient_as_bucket_view")
        rows.append(
            f"| {model} ({g['param_mb'].iloc[0]:.1f} MB) | {variant} | {g.loc[False, 'ddp_extra_mb']:+.1f} / "
            f"{g.loc[True, 'ddp_extra_mb']:+.1f} | {g.loc[False, 'startup_peak_mb']:.1f} / "
            f"{g.loc[True, 'startup_peak_mb']:.1f} |"
        )
    return "\n".join(rows)


def ideal() -> str:
    """Each DDP against its ideal bound, and the page faults an iteration takes (``summary.csv``)."""
    s = pd.read_csv(REFERENCE / "bench" / "summary.csv")
    s = s[s["model"].isin(["resnet50", "bert-base"])]  # where the bound's all-reduce is the gradient's volume
    retained = pd.read_csv(REFERENCE / "bench" / "retain" / "summary.csv")
    faults = s.groupby("model")["faults_torch"].median()
    return (
        f"Measured / ideal bound: ours {s['ours_vs_ideal'].min():.2f}-{s['ours_vs_ideal'].max():.2f}, torch's "
        f"{s['torch_vs_ideal'].min():.2f}-{s['torch_vs_ideal'].max():.2f}; ours minus torch's at most "
        f"{(s['ours_vs_ideal'] - s['torch_vs_ideal']).max():+.2f}. Minor page faults per measured iteration and "
        "rank under torch's DDP, median over caps: "
        + ", ".join(f"{m} {v:,.0f}" for m, v in faults.items())
        + "; with freed memory retained, any DDP, any cap: "
        f"{retained[['faults_ours', 'faults_torch', 'faults_torch_b']].max().max():,.0f} at most."
    )


def machine() -> str:
    """The machines the committed results ran on, as their rows record them."""
    frames = [pd.read_csv(p) for p in (REFERENCE / "bench").rglob("summary.csv")]
    rows = pd.concat(frames, ignore_index=True).dropna(subset=["cpu"])
    seen = rows.drop_duplicates(["cpu", "cores", "torch_version"])
    return "\n".join(f"- {r.cpu}, {r.cores:.0f} cores, torch {r.torch_version}" for r in seen.itertuples())
