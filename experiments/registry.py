"""The figure drivers and their stored results: which drivers exist, the settings of a figure's last run, and
drawing or reporting a figure from what is stored. Used by ``python -m experiments``, the notebook and the tests.

A driver is a ``figNN_*.py`` module in this folder with ``FIGURE``, ``PAPER``, a ``Config`` dataclass,
``points(cfg)``, ``plot(df, cfg)`` and optionally ``summarize(df, cfg)`` and ``claims(df, cfg)`` (its numbers
beside the paper's, gathered by :func:`draw_claims` into one chart).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
from pathlib import Path

import pandas as pd

import experiments
from experiments import common
from harness import load_results
from harness.results import results_root

CONFIG_FILE = "driver_config.json"  # the driver settings of the last run, so `plots` redraws the same figure


BEYOND_THE_PAPER = ("zero",)  # drivers with the same contract whose figures the paper does not have


def drivers() -> dict:
    """FIGURE name -> driver module, for every ``figNN_*.py`` in this folder, then those beyond the paper."""
    found = {}
    for info in pkgutil.iter_modules(experiments.__path__):
        if info.name.startswith("fig") and info.name[3:5].isdigit():
            module = importlib.import_module(f"experiments.{info.name}")
            found[module.FIGURE] = module
    figures = dict(sorted(found.items(), key=lambda kv: int(kv[0].removeprefix("fig"))))
    return figures | {name: importlib.import_module(f"experiments.{name}") for name in BEYOND_THE_PAPER}


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


def draw(driver, cfg=None, root=None) -> Path | None:
    cfg = cfg if cfg is not None else stored_config(driver, root)
    df = load_results(driver.FIGURE, root)
    if df.empty:
        print(f"[{driver.FIGURE}] no stored results yet; run `make {driver.FIGURE}` first")
        return None
    path = common.save(driver.plot(df, cfg), driver.FIGURE, root)
    print(f"[{driver.FIGURE}] wrote {path} (and .pdf)")
    if hasattr(driver, "summarize"):
        print(driver.summarize(df, cfg))
    return path


def report(driver, root=None) -> str:
    """One markdown section: the paper's claim and setup, then the measured summary and where it ran."""
    df = load_results(driver.FIGURE, root)
    cfg = stored_config(driver, root)
    title = (driver.__doc__ or driver.FIGURE).strip().splitlines()[0]
    measured = driver.summarize(df, cfg) if not df.empty and hasattr(driver, "summarize") else "not run yet"
    return (f"## {title}\n\n- Paper ({driver.PAPER['setup']}): {driver.PAPER['claim']}.\n"
            f"- Here ({common.describe_setup(df) if not df.empty else 'no results'}):\n\n"
            + "\n".join(f"      {line}" for line in measured.splitlines()) + "\n")


def draw_claims(root=None) -> Path | None:
    """``results/figures/claims.png``: every reproduced number (with its spread over repetitions) beside the
    paper's value where the paper gives one, one panel per unit; prints the same as a table."""
    found, frames = [], []
    for driver in drivers().values():
        df = load_results(driver.FIGURE, root)
        if hasattr(driver, "claims") and not df.empty:
            found += driver.claims(df, stored_config(driver, root))
            frames.append(df)
    if not found:
        print("[claims] no stored results yet; run a figure first (`make fig7`)")
        return None
    units = sorted({c.unit for c in found})
    fig, axes = common.grid(units, [""], width=8.0, height=0.3 * max(len(found), 4))
    for ax, unit in zip(axes[:, 0], units):
        rows = [c for c in found if c.unit == unit]
        ys = range(len(rows))
        m = [c.measured for c in rows]
        ax.errorbar([x.center for x in m], ys, xerr=[[x.center - x.lo for x in m], [x.hi - x.center for x in m]],
                    fmt="o", color="C0", capsize=3, label="measured here (95% interval over repetitions)")
        paper = [(c.paper, y) for c, y in zip(rows, ys) if c.paper is not None]
        if paper:
            ax.plot(*zip(*paper), "D", color="C3", label="paper")
        ax.set_yticks(list(ys), [f"{c.figure}: {c.what}" for c in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("speedup or saving (%)" if unit == "%" else "ratio (x)")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7)
    rows = pd.DataFrame([dict(figure=c.figure, what=c.what, paper=c.paper, measured=c.measured.fmt(c.unit, 2))
                         for c in found])
    print(rows.to_string(index=False))
    common.finish(fig, "Measured here vs the paper", "red diamonds (claims of a shape only have none)",
                  pd.concat(frames, ignore_index=True))
    path = common.save(fig, "claims", root)
    print(f"[claims] wrote {path} (and .pdf)")
    return path
