"""Launch ranks, build models and inputs, time phases, store rows, run sweeps and microbenchmarks.

Public API (what experiment drivers use):
    TrainConfig, AllreduceConfig          point configs (harness.config)
    ConvergenceConfig                     real-data convergence point (harness.workloads.convergence, .data)
    validate(cfg), point_id(cfg)          checks before launch; stable id of a point
    parse_dataclass(cls, argv), add_dataclass_arguments(parser, cls)   --key=value overrides
    run_sweep(experiment, points, ...)    resumable sweep with progress bar and dry run
    run_point(cfg)                        one point, rows returned, nothing stored
    load_results(experiment), summarize(df, by=[...])
    LaunchError, RankContext              what a launch raises; what a rank function receives
The one way ranks are started is harness.launch.spawn.launch(fn, world_size, backend, ...) (spawned, or torchrun in
place); the subpackages (launch, netem, workloads) are imported by their own names. See harness/README.md for
launching on a cluster.
"""

from harness.cli import add_dataclass_arguments, dataclass_from_namespace, parse_dataclass
from harness.config import AllreduceConfig, ConvergenceConfig, TrainConfig, point_id, validate
from harness.launch.spawn import LaunchError, RankContext
from harness.results import SCHEMA, load_results, summarize
from harness.sweep import run_point, run_sweep

__all__ = [
    "AllreduceConfig",
    "ConvergenceConfig",
    "TrainConfig",
    "add_dataclass_arguments",
    "dataclass_from_namespace",
    "parse_dataclass",
    "point_id",
    "validate",
    "LaunchError",
    "RankContext",
    "SCHEMA",
    "load_results",
    "summarize",
    "run_point",
    "run_sweep",
]
