"""Run a figure's sweep and draw it, or redraw figures from stored results.

    python -m experiments list                      the drivers (experiments/figures/, and zero)
    python -m experiments fig7 [--key=value ...]    sweep (stored points are skipped), then plot
    python -m experiments fig7 --dry-run            list the points and whether each is stored
    python -m experiments plots [fig7 ...]          redraw every figure whose results are stored (or those named),
                                                    no runs; --figures_dir=DIR writes them there
    python -m experiments report [fig7 ...]         markdown: per figure, the paper's claim beside what was measured
    python -m experiments report --write|--check    the documents' generated regions from results/reference
    python -m experiments claims                    one chart of every measured number beside the paper's
    python -m experiments TOOL [--key=value ...]    a tool (below: bench, bucket-cost, gpu-check, predict, ...);
                                                    TOOL --help lists its options

Figures go to results/figures/ (``$DDP_REPRO_RESULTS``/figures/), or where ``--figures_dir`` or
``$DDP_REPRO_FIGURES`` says; redrawing the committed reference (``DDP_REPRO_RESULTS=results/reference``) writes
to results/figures/reference/, outside the tracked tree. Under torchrun every rank runs the sweep in place and
rank 0 stores and plots (see harness/README.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import os
import sys

from experiments.common import left_out_backends
from experiments.registry import draw, draw_claims, drivers, figures, report, save_config
from harness import add_dataclass_arguments, dataclass_from_namespace, run_sweep
from harness.cli import OneLineParser
from harness.launch.env import is_writer
from harness.launch.errors import ConfigError, command_line, refusing
from harness.results import figures_dir

# The tools (experiments/tools/, and paper_scale): what each measures or answers; each module has main(argv).
TOOLS = {
    "autotune": "experiments.tools.autotune",
    "bench": "experiments.tools.bench",
    "bucket-cost": "experiments.tools.bucket_cost",
    "gpu-check": "experiments.tools.gpu_check",
    "hostval": "experiments.tools.hostval",
    "paper-scale": "experiments.paper_scale",
    "predict": "experiments.tools.predict",
    "simval": "experiments.tools.simval",
    "timeline": "experiments.tools.timeline",
    "tune": "experiments.tools.tune",
}
COMMANDS = ("list", "plots", "report", "claims", *TOOLS)


def run_figure(driver, argv: list[str]) -> int:
    parser = OneLineParser(
        prog=f"python -m experiments {driver.FIGURE}", description=(driver.__doc__ or "").split("\n\n")[0]
    )
    add_dataclass_arguments(parser, driver.Config)
    # each also with underscores, as python -m harness spells them
    parser.add_argument("--dry-run", "--dry_run", action="store_true", help="list the points, run nothing")
    parser.add_argument(
        "--retry-errors", "--retry_errors", action="store_true", help="rerun points stored with an error"
    )
    parser.add_argument(
        "--plot-only", "--plot_only", action="store_true", help="redraw from stored results, run nothing"
    )
    add_figures_dir(parser)
    ns = parser.parse_args(argv)
    with refusing():
        cfg = dataclass_from_namespace(driver.Config, ns)
        left_out = left_out_backends(cfg) if not ns.plot_only else {}
        points = driver.points(cfg)
        if not points and not ns.plot_only:
            raise ValueError(f"these settings give no point to measure ({_empty(cfg)})")
    if left_out and is_writer():
        print(
            f"[{driver.FIGURE}] left out: " + "; ".join(f"{b} ({why})" for b, why in left_out.items()), file=sys.stderr
        )
    if not ns.plot_only:
        run_sweep(
            driver.FIGURE,
            points,
            dry_run=ns.dry_run,
            retry_errors=ns.retry_errors,
            order_seed=getattr(cfg, "order_seed", 0),
        )
        if ns.dry_run:
            return 0
        if is_writer():
            save_config(driver, cfg)
    if is_writer():
        with figures_to(ns.figures_dir):
            draw(driver, cfg)
    return 0


def add_figures_dir(parser) -> None:
    parser.add_argument(
        "--figures_dir",
        metavar="DIR",
        default="",
        help="write the figures (PNG and PDF) here (default: $DDP_REPRO_FIGURES, else the results "
        "folder's figures/; results/figures/reference/ when that is results/reference)",
    )


@contextlib.contextmanager
def figures_to(folder: str):
    """Inside, figures are written to ``folder`` (as ``$DDP_REPRO_FIGURES`` says); nothing changes for ''."""
    if not folder:
        yield
        return
    was = os.environ.get("DDP_REPRO_FIGURES")
    os.environ["DDP_REPRO_FIGURES"] = folder
    try:
        yield
    finally:
        if was is None:
            del os.environ["DDP_REPRO_FIGURES"]
        else:
            os.environ["DDP_REPRO_FIGURES"] = was


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return command_line("python -m experiments" + (f" {argv[0]}" if argv else ""), lambda: _main(argv))


def _main(argv: list[str]) -> int:
    if argv and argv[0] in TOOLS:  # a tool needs no figure driver imported
        return importlib.import_module(TOOLS[argv[0]]).main(argv[1:])
    found = drivers()
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__)
        print("figures:")
        for name, module in found.items():
            print(f"  {name:11s} {_first_line(module)}")
        print("tools:")
        for name, module in TOOLS.items():
            print(f"  {name:11s} {_first_line(importlib.import_module(module))}")
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("report", "plots", "claims"):
        return _stored(command, rest, found)
    if command not in found:
        raise ConfigError(
            f"unknown figure {command!r}; choose one of {', '.join(found)} (or `list`, `plots`, "
            f"`report`, `claims`, or a tool: {', '.join(TOOLS)}){_suggest(command, [*found, *COMMANDS])}"
        )
    return run_figure(found[command], rest)


_STORED = {
    "plots": "redraw every figure whose results are stored (or those named), no runs: the drivers' figures, "
    "their variants stored beside them (fig7-hosts2 ...), tune, simval, timeline and claims; a "
    "figure with nothing stored is skipped with a note",
    "report": "markdown: per figure, the paper's claim beside what was measured",
    "claims": "one chart of every measured number beside the paper's (results/figures/claims.png)",
}  # what each of the commands that read stored results does, for its --help


def _stored(command: str, argv: list[str], found: dict) -> int:
    """``plots``, ``report`` and ``claims``: read stored results, run nothing."""
    ns = _stored_parser(command, found).parse_args(argv)
    if command == "report":
        return _report(ns, found)
    with figures_to(ns.figures_dir):
        if command == "claims":
            draw_claims()
            return 0
        _plots(ns.figures)
    return 0


def _stored_parser(command: str, found: dict) -> OneLineParser:
    parser = OneLineParser(prog=f"python -m experiments {command}", description=_STORED[command])
    if command == "report":
        parser.add_argument(
            "figures", nargs="*", metavar="FIGURE", help=f"one or more of {', '.join(found)} (default: all of them)"
        )
        parser.add_argument(
            "--write",
            action="store_true",
            help="rewrite the generated regions of "
            "README.md, REPRODUCTION.md and BENCHMARKS.md from results/reference (`make report`)",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="change nothing; exit 1 when a document's generated regions differ from what results/reference gives",
        )
    if command == "plots":
        parser.add_argument(
            "figures",
            nargs="*",
            metavar="FIGURE",
            help=f"one or more of {', '.join(found)}, a variant stored beside one (fig7-hosts2), "
            f"tune, simval, timeline, claims (default: all of them)",
        )
    if command != "report":
        add_figures_dir(parser)
    return parser


def _report(ns, found: dict) -> int:
    """``report``: the markdown sections of the figures named, or (``--write``/``--check``) the documents'
    generated regions."""
    if ns.write or ns.check:
        from experiments.tools.report import update

        differ = update(check=ns.check)
        verb = "differ from results/reference (run `make report`)" if ns.check else "rewritten"
        print(f"[report] {', '.join(differ) or 'no document'} {verb if differ else 'differs'}")
        return 1 if ns.check and differ else 0
    for name in _known(ns.figures or list(found), found):
        print(report(found[name]))
    return 0


def _plots(names: list[str]) -> None:
    """``plots``: redraw the figures named (default: every one), saying which had nothing stored."""
    every = figures()
    drawn, skipped = [], []
    for name in _known(names or list(every), every):
        (drawn if every[name]() is not None else skipped).append(name)
    print(
        f"[plots] redrew {len(drawn)} figure(s) into {figures_dir()}"
        + (f"; nothing stored for {', '.join(skipped)} (skipped)" if skipped else "")
    )


def _first_line(module) -> str:
    return (module.__doc__ or "").strip().splitlines()[0]


def _known(names, found: dict) -> list[str]:
    unknown = [n for n in names if n not in found]
    if unknown:
        raise ConfigError(
            f"unknown figure {unknown[0]!r}; choose one of {', '.join(found)}{_suggest(unknown[0], found)}"
        )
    return list(names)


def _suggest(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _empty(cfg) -> str:
    """Which settings of a Config left its sweep empty, for the refusal."""
    empty = [f"{f.name} is empty" for f in dataclasses.fields(cfg) if getattr(cfg, f.name) == ()]
    if getattr(cfg, "repeats", 1) < 1:
        empty.append(f"repeats={cfg.repeats}: give at least 1")
    return "; ".join(empty) or "see --dry-run"


if __name__ == "__main__":
    sys.exit(main())
