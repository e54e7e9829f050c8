"""Run one point from the command line (stored like any sweep point, so reruns are skipped).

    python -m harness train --model=small --impl=torch --world_size=2 --iters=5
    python -m harness allreduce --world_size=2 --params_per_call=100000
    torchrun --nproc_per_node=2 -m harness train --model=small --world_size=2     # in place
Options: every field of TrainConfig / AllreduceConfig as --key=value, plus --experiment=NAME (default
``adhoc``), --dry_run, --retry_errors and --root=DIR.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from harness.cli import OneLineParser, add_dataclass_arguments, dataclass_from_namespace
from harness.config import AllreduceConfig, TrainConfig
from harness.launch.env import is_writer
from harness.launch.errors import ConfigError, command_line
from harness.results import summarize
from harness.sweep import run_sweep

KINDS = {"train": TrainConfig, "allreduce": AllreduceConfig}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    kind = f" {argv[0]}" if argv and not argv[0].startswith("-") else ""
    return command_line(f"python -m harness{kind}", lambda: _main(argv))


def _main(argv: list[str]) -> int:
    top = OneLineParser(
        prog="python -m harness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    top.add_argument(
        "kind",
        choices=list(KINDS),
        help="; ".join(f"{k}: {c.__doc__.splitlines()[0].rstrip('.')}" for k, c in KINDS.items()),
    )
    if argv and argv[0] in ("-h", "--help"):
        top.parse_args(["--help"])
    if not argv or argv[0].startswith("-"):
        top.error(f"give the kind first: python -m harness {{{','.join(KINDS)}}} [--key=value ...]")
    kind, rest = argv[0], argv[1:]
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, list(KINDS), n=1)
        raise ConfigError(
            f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}"
            + (f"; did you mean {close[0]}?" if close else "")
        )
    parser = add_dataclass_arguments(
        OneLineParser(prog=f"python -m harness {kind}", description=KINDS[kind].__doc__), KINDS[kind]
    )
    parser.add_argument("--experiment", default="adhoc", help="results/<experiment>/ holds the point (default: adhoc)")
    parser.add_argument("--root", default=None, help="results folder (default: results/ or $DDP_REPRO_RESULTS)")
    parser.add_argument(
        "--dry_run", "--dry-run", action="store_true", help="say whether the point is stored, run nothing"
    )
    parser.add_argument(
        "--retry_errors", "--retry-errors", action="store_true", help="rerun the point if it is stored with an error"
    )
    ns = parser.parse_args(rest)
    ns.kind = kind
    cfg = dataclass_from_namespace(KINDS[ns.kind], ns)
    df = run_sweep(ns.experiment, [cfg], root=ns.root, dry_run=ns.dry_run, retry_errors=ns.retry_errors)
    if ns.dry_run or not is_writer():
        return 0
    from harness.config import point_id

    mine = df[df["point_id"] == point_id(cfg)]
    if (mine["error"] != "").any():
        print(mine["error"].iloc[0], file=sys.stderr)
        return 1
    metrics = ["total_ms", "forward_ms", "backward_compute_ms", "backward_comm_exposed_ms", "optimizer_ms"]
    if ns.kind == "allreduce":
        metrics = ["total_ms", "algbw_gbps", "busbw_gbps"]
    print(summarize(mine, by=["point_id"], metrics=metrics).T.to_string(header=False))
    if "net_rate_mbit" in mine.columns and mine["net_rate_mbit"].notna().any():
        print(f"network: net={mine['net'].iloc[0]}, emulated {mine['net_rate_mbit'].iloc[0]:.0f} Mbit/s per rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
