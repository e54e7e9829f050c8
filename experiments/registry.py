"""The figure drivers and their stored results: which drivers exist, the settings of a figure's last run, and
drawing or reporting a figure from what is stored. Used by ``python -m experiments``, the notebook and the tests.
:func:`figures` lists every figure that can be redrawn from stored results: the drivers', their variants stored
beside them (``<FIGURE>_hosts/``), the tools' (``tune``, ``simval``, ``timeline``) and the claims chart.

A driver is a ``figNN_*.py`` module in ``experiments/figures/`` with ``FIGURE``, ``PAPER``, a ``Config`` dataclass,
``points(cfg)``, ``plot(df, cfg)`` and optionally ``summarize(df, cfg)`` and ``claims(df, cfg)`` (its numbers
beside the paper's, gathered by :func:`draw_claims` into one chart).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd

import experiments.figures
from experiments import common, plotting, verdicts
from harness import load_results
from harness.results import REFERENCE, REPO_ROOT, results_root

CONFIG_FILE = "driver_config.json"  # the driver settings of the last run, so `plots` redraws the same figure


BEYOND_THE_PAPER = ("zero",)  # drivers with the same contract whose figures the paper does not have


def drivers() -> dict:
    """FIGURE name -> driver module, for every ``figNN_*.py`` in ``experiments/figures/``, then those beyond the
    paper (tools with the same contract, in ``experiments/``)."""
    found = {}
    for info in pkgutil.iter_modules(experiments.figures.__path__):
        if info.name.startswith("fig") and info.name[3:5].isdigit():
            module = importlib.import_module(f"experiments.figures.{info.name}")
            found[module.FIGURE] = module
    figures = dict(sorted(found.items(), key=lambda kv: int(kv[0].removeprefix("fig"))))
    return figures | {name: importlib.import_module(f"experiments.{name}") for name in BEYOND_THE_PAPER}


# What a figure reads, under a results folder: a driver's (or variant's) points, else the tools' own files.
_STORED = {"tune": "tune/calibrations/*.json", "simval": "simval/validation.csv"}


def root_for(name: str, root=None, announce: bool = True) -> Path:
    """The results folder figure ``name`` reads: ``root`` or ``$DDP_REPRO_RESULTS`` where given; else ``results/``
    where it holds results of this figure, and the committed reference run ``results/reference/`` where it holds
    none (a fresh clone). ``announce``: say which, in one line."""
    if root or os.environ.get("DDP_REPRO_RESULTS"):
        chosen, why = results_root(root), ""
    else:
        mine = results_root()
        pattern = _STORED.get(name, f"{name}/points/*.csv")
        chosen = mine if any(mine.glob(pattern)) else REFERENCE
        why = " (the committed reference run: nothing of yours is stored for it)" if chosen == REFERENCE else ""
    if announce:
        print(f"[{name}] reading {_shown(chosen)}{why}")
    return chosen


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def save_config(driver, cfg, root=None) -> None:
    path = results_root(root) / driver.FIGURE / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    os.replace(tmp, path)


def stored_config(driver, root=None):
    """The Config of the last run of this figure (defaults where nothing was stored)."""
    path = results_root(root) / driver.FIGURE / CONFIG_FILE
    if not path.exists():
        return driver.Config()
    fields = {f.name: f for f in dataclasses.fields(driver.Config)}
    saved = json.loads(path.read_text())
    return driver.Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields})


def draw(driver, cfg=None, root=None, experiment: str | None = None, name: str | None = None) -> Path | None:
    """Draw a driver's figure from the rows stored as ``experiment`` (default: its own) and save it as ``name``
    (default: ``FIGURE``), with ``cfg`` (default: the settings of its last run, or as the rows say when ``cfg``
    is a function of them); says so and returns None when nothing is stored."""
    name = name or driver.FIGURE
    source = root_for(experiment or driver.FIGURE, root)  # read here, written where the caller's root says
    df = load_results(experiment or driver.FIGURE, source)
    if df.empty:
        print(f"[{name}] no stored results yet; run `make {driver.FIGURE}` first")
        return None
    cfg = cfg(df) if callable(cfg) else cfg if cfg is not None else stored_config(driver, source)
    path = plotting.save(driver.plot(df, cfg), name, root)
    print(f"[{name}] wrote {path} (and .pdf)")
    if hasattr(driver, "summarize"):
        print(driver.summarize(df, cfg))
    return path


def figures(root=None) -> dict[str, Callable[[], Path | None]]:
    """Every figure ``python -m experiments plots`` redraws, by its file name (``results/figures/<name>.png``): a
    function that redraws it from what is stored under ``root`` and returns its PNG, or says that nothing is
    stored and returns None. The drivers' figures; each one's variants stored beside it (``<FIGURE>_hosts/``: one
    figure per number of emulated hosts, ``<FIGURE>-hosts<H>``, as REPRODUCTION.md's runs on emulated hosts); those
    of the tools (``tune``, ``simval``, ``timeline``), from what their runs stored; and the claims chart, last."""
    found: dict[str, Callable[[], Path | None]] = {}
    for name, driver in drivers().items():
        found[name] = partial(draw, driver, root=root)
        found |= variants(driver, root)
    found |= {"tune": partial(draw_tune, root), "simval": partial(draw_simval, root),
              "timeline": partial(draw_timeline, root), "claims": partial(draw_claims, root)}
    return found


def variants(driver, root=None) -> dict[str, Callable[[], Path | None]]:
    """A driver's figures from rows stored beside its own under ``<FIGURE>_<what>/`` (a run with its results folder
    pointed elsewhere, then moved there): ``<FIGURE>_hosts/`` gives one figure per number of emulated hosts its rows
    hold, ``<FIGURE>-hosts<H>``; any other folder one figure, ``<FIGURE>-<what>``. The settings: those of the
    driver's last run with the models, world sizes and bucket caps the rows hold (and ``hosts=H``)."""
    out: dict[str, Callable[[], Path | None]] = {}
    source = root_for(f"{driver.FIGURE}_*", root, announce=False)
    for folder in sorted(results_root(source).glob(f"{driver.FIGURE}_*")):
        experiment, what = folder.name, folder.name[len(driver.FIGURE) + 1:]
        df = load_results(experiment, source) if (folder / "points").is_dir() else pd.DataFrame()
        if df.empty:
            continue
        if what != "hosts":
            out[f"{driver.FIGURE}-{what}"] = partial(draw, driver, partial(_config_from_rows, driver, source), root,
                                                     experiment, f"{driver.FIGURE}-{what}")
            continue
        for hosts in sorted({int(h) for h in _communicating(df).get("hosts", pd.Series(dtype=float)).fillna(1)}):
            out[f"{driver.FIGURE}-hosts{hosts}"] = partial(
                draw, driver, partial(_config_from_rows, driver, source, hosts=hosts), root, experiment,
                f"{driver.FIGURE}-hosts{hosts}")
    return out


_FROM_ROWS = {"models": "model", "world_size": "world_size", "world_sizes": "world_size",
              "bucket_caps_mb": "bucket_cap_mb"}  # Config field -> the column it is read from


def _config_from_rows(driver, root, df: pd.DataFrame, hosts: int | None = None):
    """The driver's last settings, with the models, world sizes and bucket caps the rows hold (of ``hosts``)."""
    base = stored_config(driver, root)
    fields = {f.name for f in dataclasses.fields(driver.Config)}
    rows = _communicating(df[df["error"].fillna("") == ""])
    if hosts is not None and "hosts" in rows.columns:
        rows = rows[rows["hosts"].fillna(1) == hosts]
    new = {"hosts": hosts} if hosts is not None and "hosts" in fields else {}
    for field, column in _FROM_ROWS.items():
        if field not in fields or column not in rows.columns or rows.empty:
            continue
        values = list(dict.fromkeys(rows[column].dropna().tolist()))
        was = getattr(base, field)
        if isinstance(was, tuple):
            new[field] = tuple([v for v in was if v in values] + sorted(v for v in values if v not in was))
        elif len(values) == 1:
            new[field] = type(was)(values[0])
    return dataclasses.replace(base, **new)


def _communicating(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of DDP points, not those without communication (``impl=local``, on one host whatever ``hosts``)."""
    return df[df["impl"] != "local"] if "impl" in df.columns else df


def draw_tune(root=None) -> Path | None:
    """``tune.png`` from a stored tuning run: the recommendation from its stored calibration probe (the newest,
    where several are stored) over the default grid of caps, beside the caps measured for it. No probe, no run."""
    from experiments import tune
    from simulator.calibrate import Calibration
    from simulator.tune import recommend

    cals = []
    source = root_for("tune", root)
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
    out = dict(recommended_mb=rec.cap_mb, predicted=rec.predicted_ms, band=rec.band_ms, regret=rec.regret,
               measured=None)
    ok = common.ok_rows(load_results(tune.EXPERIMENT, source))
    if not ok.empty:
        ok = ok[(ok["model"] == cfg.model) & (ok["world_size"] == cfg.world_size) & (ok["net"] == cfg.net)]
        out["measured"] = verdicts.task_medians(ok, ["bucket_cap_mb"]) if not ok.empty else None
    path = tune.plot(out, cfg, root)
    print(f"[tune] wrote {path} (and .pdf)")
    print(tune.report(out))
    return path


def draw_simval(root=None) -> Path | None:
    """``simval.png`` from the stored ``simval/validation.csv`` (every point's median prediction and measurement)."""
    from experiments import simval

    path = results_root(root_for("simval", root)) / simval.EXPERIMENT / "validation.csv"
    if not path.exists():
        print("[simval] no stored results yet; run `make simval` first")
        return None
    out = pd.read_csv(path)
    png = simval.plot(out, root)
    print(f"[simval] wrote {png} (and .pdf)")
    print(simval.summary(out).to_string())
    return png


def draw_timeline(root=None) -> Path | None:
    """``timeline.png`` and its Chrome trace from the last traced point stored under ``timeline/``."""
    from experiments import timeline

    df = common.ok_rows(load_results(timeline.NAME, root_for(timeline.NAME, root)))
    if not df.empty and "trace_buckets" in df.columns:
        df = df[df["trace_buckets"].fillna(False).astype(bool)]
    if df.empty:
        print("[timeline] no stored results yet; run `make timeline` first")
        return None
    last = df.sort_values("started_at", kind="stable")["point_id"].iloc[-1] if "started_at" in df else \
        df["point_id"].iloc[-1]
    rows = timeline.median_iteration(df[df["point_id"] == last])
    r = rows.iloc[0]
    cfg = timeline.Config(model=r["model"], bucket_cap_mb=float(r["bucket_cap_mb"]), world_size=int(r["world_size"]),
                          backend=r["backend"], profile=r["profile"], net=r["net"])
    png = plotting.save(timeline.plot(rows, cfg), timeline.NAME, root)
    trace = png.with_name(f"{timeline.NAME}.trace.json")
    trace.write_text(json.dumps(timeline.chrome_trace(rows)))
    print(f"[timeline] wrote {png} (and .pdf) and {trace}")
    return png


def report(driver, root=None) -> str:
    """One markdown section: the paper's claim and setup, then the measured summary and where it ran."""
    root = root_for(driver.FIGURE, root, announce=False)
    df = load_results(driver.FIGURE, root)
    cfg = stored_config(driver, root)
    title = (driver.__doc__ or driver.FIGURE).strip().splitlines()[0]
    measured = driver.summarize(df, cfg) if not df.empty and hasattr(driver, "summarize") else "not run yet"
    return (f"## {title}\n\n- Paper ({driver.PAPER['setup']}): {driver.PAPER['claim']}.\n"
            f"- Here ({plotting.describe_setup(df) if not df.empty else 'no results'}; read from {_shown(root)}):\n\n"
            + "\n".join(f"      {line}" for line in measured.splitlines()) + "\n")


def _claim_axis(claim: verdicts.Claim) -> str:
    """The x axis label of the claims chart's panel for ``claim``: efficiencies (100 = ideal) apart from speedups and
    savings (0 = none), and both apart from ratios."""
    if claim.unit != "%":
        return "ratio (x)"
    return "weak-scaling efficiency (%; 100 = ideal)" if "efficiency" in claim.what else "speedup or saving (%)"


def draw_claims(root=None) -> Path | None:
    """``results/figures/claims.png``: every reproduced number (with its spread over repetitions) beside the
    paper's value where the paper gives one, one panel per unit; prints the same as a table."""
    found, frames, fallback = [], [], []
    for driver in drivers().values():
        root_of = root_for(driver.FIGURE, root, announce=False)
        df = load_results(driver.FIGURE, root_of)
        if not df.empty and root_of != results_root(root):
            fallback.append(driver.FIGURE)
        if hasattr(driver, "claims") and not df.empty:
            found += driver.claims(df, stored_config(driver, root_of))
            frames.append(df)
    if not found:
        print("[claims] no stored results yet; run a figure first (`make fig7`)")
        return None
    print(f"[claims] reading {_shown(results_root(root))}"
          + (f"; {', '.join(fallback)} from {_shown(REFERENCE)} (the committed reference run: nothing of yours is "
             "stored for them)" if fallback else ""))
    panels = {}  # x axis label -> its claims: one axis per kind of number, so each axis means one thing
    for c in found:
        panels.setdefault(_claim_axis(c), []).append(c)
    fig, axes = plotting.grid(list(panels), [""], width=8.0, height=[0.3 * len(rows) + 0.9 for rows in panels.values()])
    for ax, (xlabel, rows) in zip(axes[:, 0], panels.items()):
        ys = range(len(rows))
        m = [c.measured for c in rows]
        ax.errorbar([x.center for x in m], ys, xerr=[[x.center - x.lo for x in m], [x.hi - x.center for x in m]],
                    fmt="o", color="C0", capsize=3, label="measured here (95% interval over repetitions)")
        paper = [(c.paper, y) for c, y in zip(rows, ys) if c.paper is not None]
        if paper:
            ax.plot(*zip(*paper), "D", color="C3", label="paper")
        ax.set_yticks(list(ys), [f"{c.figure}: {c.what}" for c in rows], fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first claim on top
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7)
    rows = pd.DataFrame([dict(figure=c.figure, what=c.what, paper="-" if c.paper is None else f"{c.paper:g}{c.unit}",
                              measured=c.measured.fmt(c.unit, 2)) for c in found])
    print(rows.to_string(index=False))
    plotting.finish(fig, "Measured here vs the paper", "red diamonds (claims of a shape only have none)",
                  pd.concat(frames, ignore_index=True))
    path = plotting.save(fig, "claims", root)
    print(f"[claims] wrote {path} (and .pdf)")
    return path
