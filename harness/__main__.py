"""Run one point from the command line (stored like any sweep point, so reruns are skipped).

    python -m harness train --model=small --impl=torch --world_size=2 --iters=5
    python -m harness allreduce --world_size=2 --params_per_call=100000
    torchrun --nproc_per_node=2 -m harness train --model=small --world_size=2     # in place
Options: every field of TrainConfig / AllreduceConfig as --key=value, plus --experiment=NAME (default
``adhoc``), --dry_run, --retry_errors and --root=DIR.
"""
from __future__ import annotations

import argparse
import sys

from harness.config import AllreduceConfig, TrainConfig, add_dataclass_arguments, dataclass_from_namespace
from harness.env import is_writer
from harness.errors import command_line
from harness.results import summarize
from harness.sweep import run_sweep

KINDS = {"train": TrainConfig, "allreduce": AllreduceConfig}


def main(argv=None) -> int:
    return command_line("python -m harness", lambda: _main(argv))


def _main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    for name, cls in KINDS.items():
        p = add_dataclass_arguments(sub.add_parser(name, help=cls.__doc__), cls)
        p.add_argument("--experiment", default="adhoc")
        p.add_argument("--root", default=None, help="results folder (default: results/)")
        p.add_argument("--dry_run", action="store_true")
        p.add_argument("--retry_errors", action="store_true")
    ns = parser.parse_args(argv)
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
