"""The figure drivers and their stored results: which drivers exist, the settings of a figure's last run, and
drawing or reporting a figure from what is stored. Used by ``python -m experiments``, the notebook and the tests.

A driver is a ``figNN_*.py`` module in this folder with ``FIGURE``, ``PAPER``, a ``Config`` dataclass,
``points(cfg)``, ``plot(df, cfg)`` and optionally ``summarize(df, cfg)``.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
from pathlib import Path

import experiments
from experiments import common
from harness import load_results
from harness.results import results_root

CONFIG_FILE = "driver_config.json"  # the driver settings of the last run, so `plots` redraws the same figure


def drivers() -> dict:
    """FIGURE name -> driver module, for every ``figNN_*.py`` in this folder."""
    found = {}
    for info in pkgutil.iter_modules(experiments.__path__):
        if info.name.startswith("fig") and info.name[3:5].isdigit():
            module = importlib.import_module(f"experiments.{info.name}")
            found[module.FIGURE] = module
    return dict(sorted(found.items(), key=lambda kv: int(kv[0].removeprefix("fig"))))


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
