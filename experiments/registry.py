"""The figure drivers and their stored results: which drivers exist, the settings of a figure's last run, and
drawing or reporting a figure from what is stored. Used by ``python -m experiments``, the notebook and the tests.
:func:`figures` lists every figure that can be redrawn from stored results: the drivers', their variants stored
beside them (``<FIGURE>_hosts/``), the tools' (``tune``, ``simval``, ``timeline``: ``experiments.tool_figures``)
and the claims chart (``experiments.claims_chart``).

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
from experiments import claims_chart, plotting, tool_figures, verdicts
from harness import load_results
from harness.results import REFERENCE, REPO_ROOT, results_root

CONFIG_FILE = "driver_config.json"  # the driver settings of the last run, so `plots` redraws the same figure


BEYOND_THE_PAPER = ("zero",)  # drivers with the same contract whose figures the paper does not have


def drivers() -> dict:
    """FIGURE name -> driver module, for every ``figNN_*.py`` in ``experiments/figures/``, then those beyond the
    paper (drivers with the same contract, in ``experiments/figures/``)."""
    found = {}
    for info in pkgutil.iter_modules(experiments.figures.__path__):
        if info.name.startswith("fig") and info.name[3:5].isdigit():
            module = importlib.import_module(f"experiments.figures.{info.name}")
            found[module.FIGURE] = module
    figures = dict(sorted(found.items(), key=lambda kv: int(kv[0].removeprefix("fig"))))
    return figures | {name: importlib.import_module(f"experiments.figures.{name}") for name in BEYOND_THE_PAPER}


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
    found |= {name: partial(_draw_tool, name, root) for name in tool_figures.DRAW}
    found["claims"] = partial(draw_claims, root)
    return found


def _draw_tool(name: str, root=None) -> Path | None:
    """A tool's figure (``experiments.tool_figures``) from the results folder :func:`root_for` picks for it."""
    return tool_figures.DRAW[name](root_for(name, root), root)


def variants(driver, root=None) -> dict[str, Callable[[], Path | None]]:
    """A driver's figures from rows stored beside its own under ``<FIGURE>_<what>/`` (a run with its results folder
    pointed elsewhere, then moved there): ``<FIGURE>_hosts/`` gives one figure per number of emulated hosts its rows
    hold, ``<FIGURE>-hosts<H>``; any other folder one figure, ``<FIGURE>-<what>``. The settings: those of the
    driver's last run with the models, world sizes and bucket caps the rows hold (and ``hosts=H``)."""
    out: dict[str, Callable[[], Path | None]] = {}
    source = root_for(f"{driver.FIGURE}_*", root, announce=False)
    for folder in sorted(results_root(source).glob(f"{driver.FIGURE}_*")):
        experiment, what = folder.name, folder.name[len(driver.FIGURE) + 1 :]
        df = load_results(experiment, source) if (folder / "points").is_dir() else pd.DataFrame()
        if df.empty:
            continue
        if what != "hosts":
            out[f"{driver.FIGURE}-{what}"] = partial(
                draw, driver, partial(_config_from_rows, driver, source), root, experiment, f"{driver.FIGURE}-{what}"
            )
            continue
        for hosts in sorted({int(h) for h in _communicating(df).get("hosts", pd.Series(dtype=float)).fillna(1)}):
            out[f"{driver.FIGURE}-hosts{hosts}"] = partial(
                draw,
                driver,
                partial(_config_from_rows, driver, source, hosts=hosts),
                root,
                experiment,
                f"{driver.FIGURE}-hosts{hosts}",
            )
    return out


_FROM_ROWS = {
    "models": "model",
    "world_size": "world_size",
    "world_sizes": "world_size",
    "bucket_caps_mb": "bucket_cap_mb",
}  # Config field -> the column it is read from


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


def report(driver, root=None) -> str:
    """One markdown section: the paper's claim and setup, then the measured summary and where it ran."""
    root = root_for(driver.FIGURE, root, announce=False)
    df = load_results(driver.FIGURE, root)
    cfg = stored_config(driver, root)
    title = (driver.__doc__ or driver.FIGURE).strip().splitlines()[0]
    measured = driver.summarize(df, cfg) if not df.empty and hasattr(driver, "summarize") else "not run yet"
    return (
        f"## {title}\n\n- Paper ({driver.PAPER['setup']}): {driver.PAPER['claim']}.\n"
        f"- Here ({plotting.describe_setup(df) if not df.empty else 'no results'}; read from {_shown(root)}):\n\n"
        + "\n".join(f"      {line}" for line in measured.splitlines())
        + "\n"
    )


def draw_claims(root=None) -> Path | None:
    """``results/figures/claims.png``: every reproduced number (with its spread over repetitions) beside the
    paper's value where the paper gives one, one panel per unit (``experiments.claims_chart``); prints the same as
    a table."""
    found, frames, fallback = _stored_claims(root)
    if not found:
        print("[claims] no stored results yet; run a figure first (`make fig7`)")
        return None
    print(
        f"[claims] reading {_shown(results_root(root))}"
        + (
            f"; {', '.join(fallback)} from {_shown(REFERENCE)} (the committed reference run: nothing of yours is "
            "stored for them)"
            if fallback
            else ""
        )
    )
    fig = claims_chart.figure(found, frames)
    print(claims_chart.table(found).to_string(index=False))
    path = plotting.save(fig, "claims", root)
    print(f"[claims] wrote {path} (and .pdf)")
    return path


def _stored_claims(root=None) -> tuple[list[verdicts.Claim], list[pd.DataFrame], list[str]]:
    """Every driver's claims from its stored rows, the rows they come from, and the figures read from the
    committed reference run for want of rows of yours (:func:`root_for`)."""
    found, frames, fallback = [], [], []
    for driver in drivers().values():
        root_of = root_for(driver.FIGURE, root, announce=False)
        df = load_results(driver.FIGURE, root_of)
        if not df.empty and root_of != results_root(root):
            fallback.append(driver.FIGURE)
        if hasattr(driver, "claims") and not df.empty:
            found += driver.claims(df, stored_config(driver, root_of))
            frames.append(df)
    return found, frames, fallback
