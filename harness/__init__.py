"""Launch ranks, build models and inputs, time phases, store rows, run sweeps and microbenchmarks.

Public API (what experiment drivers use):
    TrainConfig, AllreduceConfig          point configs (harness.config)
    ConvergenceConfig                     real-data convergence point (harness.convergence, harness.data)
    validate(cfg), point_id(cfg)          checks before launch; stable id of a point
    parse_dataclass(cls, argv), add_dataclass_arguments(parser, cls)   --key=value overrides
    run_sweep(experiment, points, ...)    resumable sweep with progress bar and dry run
    run_point(cfg)                        one point, rows returned, nothing stored
    load_results(experiment), summarize(df, by=[...])
    launch(fn, world_size, backend, ...)  the one way ranks are started (spawn or torchrun in place)
See harness/README.md for launching on a cluster.
"""
from harness.config import (AllreduceConfig, ConvergenceConfig, TrainConfig, add_dataclass_arguments,
                            dataclass_from_namespace, parse_dataclass, point_id, validate)
from harness.launch import LaunchError, RankContext, launch
from harness.results import SCHEMA, load_results, summarize
from harness.sweep import run_point, run_sweep

__all__ = [
    "AllreduceConfig", "ConvergenceConfig", "TrainConfig", "add_dataclass_arguments", "dataclass_from_namespace",
    "parse_dataclass", "point_id", "validate", "LaunchError", "RankContext", "launch", "SCHEMA", "load_results",
    "summarize", "run_point", "run_sweep",
]
