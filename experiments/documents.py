"""The documents' numbers, generated from the committed results (``make report``), so that they cannot drift.

A document holds regions::

    <!-- make report: NAME -->
    ...generated...
    <!-- end: NAME -->

``make report`` rewrites every region's body from ``results/reference/`` (REGIONS says which names exist);
``--check`` changes nothing and fails when a committed document differs from what its results give. Prose outside
the regions says what is measured and how; the numbers live inside them. A result produced by code older than what
the code now computes (a calibration of an earlier version; an earlier ``ddp_impl`` for the bench) is marked so.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd

from experiments import registry
from experiments.bench import PER_GRADIENT
from harness import load_results
from harness.results import REFERENCE, REPO_ROOT as ROOT

DOCUMENTS = ("README.md", "REPRODUCTION.md", "BENCHMARKS.md")
_REGION = re.compile(r"(<!-- make report: (?P<name>[^>]+?) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)


def _code(text: str) -> str:
    return f"```\n{text.rstrip()}\n```"


def figure(name: str) -> str:
    """A figure's section: its title, the committed picture, the paper's claim and what was measured."""
    driver = registry.drivers()[name]
    section = registry.report(driver, REFERENCE).replace("; read from results/reference", "")
    title, body = section.split("\n", 1)
    image = f"results/reference/figures/{name}.png"
    shown = f"\n![{name}]({image})\n" if (ROOT / image).exists() else ""
    return f"{title}\n{shown}{body.rstrip()}"


def verdicts() -> str:
    """Every number the figures check against the paper, with its interval over repetitions."""
    rows = ["| fig | measured here, median [95% interval over repetitions] | paper |", "|---|---|---|"]
    for name, driver in registry.drivers().items():
        df = load_results(driver.FIGURE, REFERENCE)
        if df.empty or not hasattr(driver, "claims"):
            continue
        for c in driver.claims(df, registry.stored_config(driver, REFERENCE)):
            paper = "shape only" if c.paper is None else f"{c.paper:g}{c.unit}"
            rows.append(f"| {name[3:]} | {c.what}: {c.measured.fmt(c.unit, 2)} | {paper} |")
    return "\n".join(rows)


def paper_scale() -> str:
    from experiments.paper_scale import claims_at_scale, published_checks

    claims = ["| claim (paper-v100, 25 MiB) | simulated [lowest, highest] | the paper's |", "|---|---|---|"]
    claims += [f"| {' | '.join(row)} |" for row in claims_at_scale()]
    checks = ["| published run (DLPerf, 25 MiB) | simulated | measured | miss |", "|---|---|---|---|"]
    checks += [f"| {' | '.join(row)} |" for row in published_checks()]
    return "\n".join(claims) + "\n\n" + "\n".join(checks)


def zero() -> str:
    driver = registry.drivers()["zero"]
    df = load_results(driver.FIGURE, REFERENCE)
    return _code(driver.summarize(df, registry.stored_config(driver, REFERENCE)))


def stress() -> str:
    """``make stress``'s exit script per ending (ours beside torch's DDP) and its fresh clones, as stored."""
    where = REFERENCE / "stress"
    e = pd.read_csv(where / "exit.csv")
    counts = e.groupby(["ending", "impl"]).agg(
        runs=("run", "size"), aborted=("aborted", "sum"), failed=("returncode", lambda r: int((r != 0).sum())),
        left=("ranks_with_threads_left", lambda n: int((n > 0).sum())))
    rows = ["| ending | ours: runs, aborted, failed, Gloo threads left | torch's DDP: the same |", "|---|---|---|"]
    for ending, g in counts.groupby(level="ending"):
        cells = [", ".join(str(int(v)) for v in g.xs(impl, level="impl").iloc[0]) for impl in ("ours", "torch")]
        rows.append(f"| {ending} | {cells[0]} | {cells[1]} |")
    f = pd.read_csv(where / "fresh_clones.csv")
    clones = [f"Fresh clones, CI's `make test` from scratch: {int((f['returncode'] == 0).sum())} of {len(f)} passed"]
    for hog, g in f.groupby("hog"):
        clones.append(f"{'beside a CPU hog' if hog else 'without a hog'} {int((g['returncode'] == 0).sum())} of "
                      f"{len(g)} ({g['seconds'].min()}-{g['seconds'].max()} s, {int(g['failed'].sum())} failed tests)")
    return "\n".join(rows) + "\n\n" + "; ".join(clones) + "."


def _stale(commits: pd.Series) -> str:
    """A closing line when the rows' ``ddp_impl`` is not today's; '' when it is."""
    since = _ddp_impl_since(commits.dropna())
    return f"\n\n**All of the above**: {since}." if since else ""


def _ddp_impl_since(commits) -> str:
    """How the ``ddp_impl`` that measured (commits) differs from the one in this working tree: "" when the same."""
    changed = set()
    for commit in {c.removesuffix("+dirty") for c in commits}:  # a tree with changes: compared from its commit
        done = subprocess.run(["git", "diff", "--name-only", commit, "--", "ddp_impl"], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            return "measured by code that is not in this clone's history"
        changed |= {Path(p).name for p in done.stdout.split()}
    return f"measured with an earlier `ddp_impl` ({', '.join(sorted(changed))} changed since)" if changed else ""


_BENCH_RUNS = {"": "", "retain": "freed memory retained"}


def bench(folders=("", "retain")) -> str:
    """``make bench``'s pooled ratios per model (ours, ours with its timing off, and the A/A: all against torch's
    DDP) and ours / torch per cap, from each of ``folders`` under ``results/reference/bench/``."""
    rows = ["| model | run | caps x rounds | ours / torch | timing off | A/A | per cap (MiB: ratio) |",
            "|---|---|---|---|---|---|---|"]
    stale = []
    for folder in folders:
        pooled = pd.read_csv(REFERENCE / "bench" / folder / "pooled.csv")
        points = pd.read_csv(REFERENCE / "bench" / folder / "summary.csv")
        since = _ddp_impl_since(points["git_commit"].dropna())
        if since:
            stale.append(f"**{(_BENCH_RUNS.get(folder, folder) or 'the default run').capitalize()}**: {since}.")
        for model, g in pooled.groupby("model", sort=False):
            ratio = {r.comparison.split(" /")[0]: f"{r.pooled_ratio:.3f} [{r.ci_lo:.3f}, {r.ci_hi:.3f}]"
                     for r in g.itertuples()}
            base = model.removesuffix(PER_GRADIENT)
            mine = points[(points["model"] == base) & ((points["bucket_cap_mb"] == 0) == (model != base))]
            caps = ", ".join(f"{r.bucket_cap_mb:g}: {r.paired_ratio:.3f}" for r in mine.itertuples())
            rows.append(f"| {model} | {_BENCH_RUNS.get(folder, folder)} | {g['points'].iloc[0]} x "
                        f"{g['rounds'].iloc[0] // g['points'].iloc[0]} | **{ratio['ours']}** | "
                        f"{ratio['ours_notiming']} | {ratio['torch_b']} | {caps} |")
    return "\n".join(rows) + "".join(f"\n\n{s}" for s in stale)


def bucket_cost() -> str:
    """``python -m experiments.bucket_cost``: each DDP's cost per bucket, and ours's path step by step."""
    where = REFERENCE / "bucket_cost"
    per, steps = pd.read_csv(where / "per_bucket.csv"), pd.read_csv(where / "steps.csv")
    rows = ["| ranks | DDP | us per added bucket [95% CI] | us over no DDP, per bucket | iteration / torch's, a bucket "
            "per gradient [95% CI] |", "|---|---|---|---|---|"]
    rows += [f"| {r.world_size} | {r.ddp} | {r.us_per_bucket:.2f} [{r.ci_lo:.2f}, {r.ci_hi:.2f}] | "
             f"{r.us_over_local_per_bucket:.2f} | {r.over_torch:.3f} [{r.over_torch_lo:.3f}, {r.over_torch_hi:.3f}] |"
             for r in per.itertuples()]
    table = ["| ranks | step, alone | us per bucket [95% CI] |", "|---|---|---|"]
    table += [f"| {r.world_size} | {r.step} | {r.us_per_bucket:.2f} [{r.ci_lo:.2f}, {r.ci_hi:.2f}] |"
              for r in steps[steps["world_size"] == 1].itertuples()]  # at 2 ranks the floor is the link's
    one = per[(per["world_size"] == 1) & (per["ddp"] == "ours")]["us_per_bucket"]
    alone = steps[steps["world_size"] == 1]["us_per_bucket"].sum()
    rest = (f" At 1 rank, ours's cost per added bucket less the three steps alone (its Python bookkeeping, and what "
            f"the steps cost more inside backward): {one.iloc[0] - alone:.2f} us." if len(one) else "")
    return ("\n".join(rows) + "\n\n" + "\n".join(table) + f"\n\n{per['model'].iloc[0]}, {per['buckets'].iloc[0]} "
            f"buckets at cap 0.{rest}" + _stale(per["git_commit"]))


def _calibration_note(versions) -> str:
    from simulator.calibrate import VERSION

    old = sorted({int(v) for v in versions if int(v) != VERSION})
    return (f" **Stale**: calibration version {', '.join(map(str, old))}, the code is at version {VERSION}; "
            "`make simval` measures it again.") if old else f" Calibration version {VERSION}, the code's."


def _calibration_versions(folder: Path) -> list[int]:
    import json

    return [json.loads(p.read_text()).get("meta", {}).get("version", 0) for p in folder.glob("*.json")]


def simval() -> str:
    from experiments.simval import summary

    where = REFERENCE / "simval"
    errors = summary(pd.read_csv(where / "validation.csv"))
    tuning = pd.read_csv(where / "tuning.csv")
    lines = ["| model | points | median error % | worst % |", "|---|---|---|---|"]
    lines += [f"| {m} | {r['points']:.0f} | {r['median']} | {r['worst']} |" for m, r in errors.iterrows()]
    validation = pd.read_csv(where / "validation.csv")
    grid = "; ".join(f"{m}: {len(g)} points at {', '.join(sorted(g['net'].unique()))} and "
                     f"{', '.join(str(w) for w in sorted(g['world_size'].unique()))} ranks, {g['rounds'].max()} rounds"
                     for m, g in validation.groupby("model"))
    within = int(tuning["within_goal"].sum())
    ratio = tuning["confirmed_over_best"].fillna(tuning["recommended_over_best"])  # side by side where measured
    note = (f"\n\nGrid: {grid}. Recommended cap within 2% of the best measured: {within} of {len(tuning)} (model, "
            f"world size, link); recommended / best {ratio.min():.3f}-{ratio.max():.3f} (side by side where they "
            f"differ), torch's 25 MiB / best up to {tuning['default_over_best'].max():.3f}.")
    return "\n".join(lines) + note + _calibration_note(_calibration_versions(where / "calibrations"))


def hostval() -> str:
    from experiments.hostval import summary

    runs = sorted((REFERENCE / "hostval").glob("run*.csv"), key=lambda p: int(p.stem[3:]))
    table = summary(pd.read_csv(runs[-1]))
    lines = ["| ranks | cap MiB | buckets | repeats | error % [95% CI] |", "|---|---|---|---|---|"]
    lines += [f"| {r.world_size} | {r.bucket_cap_mb:g} | {r.buckets} | {r.repeats} | {r.error_pct:+.1f} "
              f"[{r.ci_lo_pct:+.1f}, {r.ci_hi_pct:+.1f}] |" for r in table.itertuples()]
    return "\n".join(lines)


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


def run_times() -> str:
    f = pd.read_csv(REFERENCE / "stress" / "fresh_clones.csv")
    ok = f[f["returncode"] == 0]
    text = (f"`make test` from a fresh clone, set-up included: {ok['seconds'].median():.0f} s median, "
            f"{ok['seconds'].min()}-{ok['seconds'].max()} s over {len(ok)} passing runs.")
    fig7 = REFERENCE / "stress" / "fig7_clones.csv"
    if fig7.exists():
        g = pd.read_csv(fig7)
        g = g[g["returncode"] == 0]
        text += (f" `make fig7` from a fresh clone, set-up included: {g['seconds'].median():.0f} s median over "
                 f"{len(g)} run(s).")
    return text


def memory() -> str:
    """``make bench``'s memory per rank above the model and inputs (``memory.csv``)."""
    m = pd.read_csv(REFERENCE / "bench" / "memory.csv")
    m = m[m["variant"] != "local"]
    rows = ["| model (parameters) | DDP | steady-state extra MB, no view / `gradient_as_bucket_view` | startup peak MB, "
            "no view / view |", "|---|---|---|---|"]
    for (model, variant), g in m.groupby(["model", "variant"], sort=False):
        g = g.set_index("gradient_as_bucket_view")
        rows.append(f"| {model} ({g['param_mb'].iloc[0]:.1f} MB) | {variant} | {g.loc[False, 'ddp_extra_mb']:+.1f} / "
                    f"{g.loc[True, 'ddp_extra_mb']:+.1f} | {g.loc[False, 'startup_peak_mb']:.1f} / "
                    f"{g.loc[True, 'startup_peak_mb']:.1f} |")
    return "\n".join(rows)


def ideal() -> str:
    """Each DDP against its ideal bound, and the page faults an iteration takes (``summary.csv``)."""
    s = pd.read_csv(REFERENCE / "bench" / "summary.csv")
    s = s[s["model"].isin(["resnet50", "bert-base"])]  # where the bound's all-reduce is the gradient's volume
    retained = pd.read_csv(REFERENCE / "bench" / "retain" / "summary.csv")
    faults = s.groupby("model")["faults_torch"].median()
    return (f"Measured / ideal bound: ours {s['ours_vs_ideal'].min():.2f}-{s['ours_vs_ideal'].max():.2f}, torch's "
            f"{s['torch_vs_ideal'].min():.2f}-{s['torch_vs_ideal'].max():.2f}; ours minus torch's at most "
            f"{(s['ours_vs_ideal'] - s['torch_vs_ideal']).max():+.2f}. Minor page faults per measured iteration and "
            "rank under torch's DDP, median over caps: " + ", ".join(f"{m} {v:,.0f}" for m, v in faults.items())
            + "; with freed memory retained, any DDP, any cap: "
            f"{retained[['faults_ours', 'faults_torch', 'faults_torch_b']].max().max():,.0f} at most.")


def machine() -> str:
    """The machines the committed results ran on, as their rows record them."""
    frames = [pd.read_csv(p) for p in (REFERENCE / "bench").rglob("summary.csv")]
    rows = pd.concat(frames, ignore_index=True).dropna(subset=["cpu"])
    seen = rows.drop_duplicates(["cpu", "cores", "torch_version"])
    return "\n".join(f"- {r.cpu}, {r.cores:.0f} cores, torch {r.torch_version}" for r in seen.itertuples())


REGIONS = {
    **{name: (lambda n=name: figure(n)) for name in ("fig2", "fig6", "fig7", "fig8", "fig9", "fig10", "fig11",
                                                     "fig12")},
    "verdicts": verdicts, "paper-scale": paper_scale, "zero": zero, "stress": stress, "bench": bench,
    "bench host-bound": lambda: bench(("host-bound",)), "memory": memory, "ideal": ideal, "machine": machine,
    "simval": simval, "bucket-cost": bucket_cost, "hostval": hostval, "gpu-check": gpu_check, "run-times": run_times,
}


def render(text: str, where: str = "") -> str:
    """``text`` with every region's body regenerated; an unknown region name is refused."""
    def body(m: re.Match) -> str:
        name = m["name"]
        if name not in REGIONS:
            raise ValueError(f"{where}: unknown region {name!r}; known: {', '.join(REGIONS)}")
        return f"{m[1]}{REGIONS[name]().rstrip()}\n{m[4]}"

    return _REGION.sub(body, text)


def update(check: bool = False) -> list[str]:
    """Rewrite (or with ``check`` only compare) every document's regions; returns the documents that differed."""
    differ = []
    for name in DOCUMENTS:
        path = ROOT / name
        old = path.read_text()
        new = render(old, name)
        if new != old:
            differ.append(name)
            if not check:
                path.write_text(new)
    return differ
