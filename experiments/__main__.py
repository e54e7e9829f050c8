"""Run a figure's sweep and draw it, or redraw figures from stored results.

    python -m experiments list                      the drivers found in this folder
    python -m experiments fig7 [--key=value ...]    sweep (stored points are skipped), then plot
    python -m experiments fig7 --dry-run            list the points and whether each is stored
    python -m experiments plots [fig7 ...]          redraw figures from the stored CSVs, no runs
    python -m experiments report [fig7 ...]         markdown: per figure, the paper's claim beside what was measured

Under torchrun every rank runs the sweep in place and rank 0 stores and plots (see harness/README.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pkgutil
import sys
from pathlib import Path

import experiments
from experiments import common
from harness import add_dataclass_arguments, dataclass_from_namespace, load_results, run_sweep
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


def _is_writer() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


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


def run_figure(driver, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m experiments {driver.FIGURE}",
                                     description=(driver.__doc__ or "").split("\n\n")[0])
    add_dataclass_arguments(parser, driver.Config)
    parser.add_argument("--dry-run", action="store_true", help="list the points, run nothing")
    parser.add_argument("--retry-errors", action="store_true", help="rerun points stored with an error")
    parser.add_argument("--plot-only", action="store_true", help="redraw from stored results, run nothing")
    ns = parser.parse_args(argv)
    cfg = dataclass_from_namespace(driver.Config, ns)
    if not ns.plot_only:
        points = driver.points(cfg)
        run_sweep(driver.FIGURE, points, dry_run=ns.dry_run, retry_errors=ns.retry_errors)
        if ns.dry_run:
            return 0
        if _is_writer():
            save_config(driver, cfg)
    if _is_writer():
        draw(driver, cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = drivers()
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__)
        for name, module in found.items():
            print(f"  {name:6s} {(module.__doc__ or '').strip().splitlines()[0]}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "report":
        for name in rest or found:
            print(report(found[name]))
        return 0
    if command == "plots":
        for name in rest or found:
            if name not in found:
                raise SystemExit(f"unknown figure {name!r}; known: {', '.join(found)}")
            draw(found[name])
        return 0
    if command not in found:
        raise SystemExit(f"unknown figure {command!r}; known: {', '.join(found)} (or `list`, `plots`)")
    return run_figure(found[command], rest)


if __name__ == "__main__":
    sys.exit(main())
