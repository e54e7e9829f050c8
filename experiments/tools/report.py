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

import pandas as pd

from experiments import registry
from experiments.tools.report_bench import autotune, bench, bucket_cost, gpu_check, ideal, machine, memory
from experiments.tools.report_simulator import hostval, simval
from harness import load_results
from harness.results import REFERENCE
from harness.results import REPO_ROOT as ROOT

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
        runs=("run", "size"),
        aborted=("aborted", "sum"),
        failed=("returncode", lambda r: int((r != 0).sum())),
        left=("ranks_with_threads_left", lambda n: int((n > 0).sum())),
    )
    rows = ["| ending | ours: runs, aborted, failed, Gloo threads left | torch's DDP: the same |", "|---|---|---|"]
    for ending, g in counts.groupby(level="ending"):
        cells = [", ".join(str(int(v)) for v in g.xs(impl, level="impl").iloc[0]) for impl in ("ours", "torch")]
        rows.append(f"| {ending} | {cells[0]} | {cells[1]} |")
    hunt = where / "tests.csv"
    if hunt.exists():
        rows += ["", _flake_hunt(pd.read_csv(hunt))]
    f = pd.read_csv(where / "fresh_clones.csv")
    clones = [f"Fresh clones, CI's `make test` from scratch: {int((f['returncode'] == 0).sum())} of {len(f)} passed"]
    for hog, g in f.groupby("hog"):
        clones.append(
            f"{'beside a CPU hog' if hog else 'without a hog'} {int((g['returncode'] == 0).sum())} of "
            f"{len(g)} ({g['seconds'].min()}-{g['seconds'].max()} s, {int(g['failed'].sum())} failed tests)"
        )
    return "\n".join(rows) + "\n\n" + "; ".join(clones) + ". " + _newest_streak(f)


def _newest_streak(f: pd.DataFrame) -> str:
    """How many of the newest fresh clones of the newest code measured passed in a row, how many beside a hog."""
    f = f[f["git_commit"] == f["git_commit"].iloc[-1]]
    failed = (f["returncode"] != 0).to_numpy()
    streak = f.tail(int((~failed[::-1]).cumprod().sum()))
    return (
        f"The newest code measured: its last {len(streak)} passed in a row, {int(streak['hog'].sum())} of them "
        "beside a CPU hog."
    )


def _flake_hunt(t: pd.DataFrame) -> str:
    """``make stress``'s runs of every test file that launches processes: how many, and every failure by test."""
    ran = t[t["outcome"] != "skipped"]
    failed = ran[ran["outcome"] == "failed"]
    quiet, hogged = (t[t["hog"] == h]["run"].nunique() for h in (False, True))
    line = (
        f"The flake hunt: {quiet} runs + {hogged} beside a CPU hog x {t['file'].nunique()} files that launch "
        f"processes: {len(ran)} test runs, {len(failed)} failures"
    )
    per_test = failed.groupby("test").size()
    return line + ("." if per_test.empty else ": " + "; ".join(f"`{k}` {v}" for k, v in per_test.items()) + ".")


def run_times() -> str:
    f = pd.read_csv(REFERENCE / "stress" / "fresh_clones.csv")
    ok = f[f["returncode"] == 0]
    text = (
        f"`make test` from a fresh clone, set-up included: {ok['seconds'].median():.0f} s median, "
        f"{ok['seconds'].min()}-{ok['seconds'].max()} s over {len(ok)} passing runs."
    )
    fig7 = REFERENCE / "stress" / "fig7_clones.csv"
    if fig7.exists():
        g = pd.read_csv(fig7)
        g = g[g["returncode"] == 0]
        text += (
            f" `make fig7` from a fresh clone, set-up included: {g['seconds'].median():.0f} s median over "
            f"{len(g)} run(s)."
        )
    return text


REGIONS = {
    **{
        name: (lambda n=name: figure(n)) for name in ("fig2", "fig6", "fig7", "fig8", "fig9", "fig10", "fig11", "fig12")
    },
    "verdicts": verdicts,
    "paper-scale": paper_scale,
    "zero": zero,
    "stress": stress,
    "bench": bench,
    "bench host-bound": lambda: bench(("host-bound",)),
    "memory": memory,
    "ideal": ideal,
    "machine": machine,
    "simval": simval,
    "bucket-cost": bucket_cost,
    "hostval": hostval,
    "gpu-check": gpu_check,
    "autotune": autotune,
    "run-times": run_times,
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
