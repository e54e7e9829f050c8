"""`make bench`: is our DDP as fast as torch's C++ Reducer, and how far are both from the ideal bound?

    make bench                                       # ResNet50, BERT-base, tiny-layers; caps 1,5,25,100 MiB
    python -m experiments bench --models=small --bucket_caps_mb=1,25 --iters=3 --out=/tmp/bench   # seconds
    python -m experiments bench --help               # every option (BenchConfig fields)

Per (model, cap): torch's DDP, ours, a second torch DDP (A/A control) and no DDP, interleaved in random order
round by round on the same ranks; per (model, variant): peak memory. Writes ``<out>/summary.csv``,
``pooled.csv`` (the number to read), ``latency_samples.csv`` and ``memory.csv``. Methods and findings:
BENCHMARKS.md.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.tools.bench_config import BenchConfig, caps_of, validate_bench
from experiments.tools.bench_ranks import latency_job, memory_job
from experiments.tools.bench_stats import pooled, summarize_point
from harness.cli import parse_dataclass
from harness.launch.allocator import MALLOC_ENV
from harness.launch.backends import check_backend
from harness.launch.env import is_writer
from harness.launch.errors import command_line, refusing
from harness.launch.spawn import launch
from harness.results import git_commit, results_root, write_csv_atomic
from harness.workloads.runner import machine_metadata

MEMORY_VARIANTS = (("local", False), ("ours", False), ("ours", True), ("torch", False), ("torch", True))


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


# Memory jobs' ranks get glibc's mmap threshold at 64 KiB, so a freed tensor's pages go back to the OS at once and
# the resident set tracks live tensors (with the default, freed memory stays resident and peaks blur).
SMALL_MMAP_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run_bench(cfg: BenchConfig) -> dict[str, pd.DataFrame]:
    """Run every point (and the memory jobs); write the CSVs after each; return the tables."""
    with refusing():  # before anything is spawned
        cfg = validate_bench(cfg)
        check_backend(cfg.backend, cfg.world_size)
    writer = is_writer()  # under torchrun every rank runs this; rank 0 writes
    out = Path(cfg.out) if cfg.out else results_root() / "bench"
    meta = dict(
        machine_metadata(), git_commit=git_commit(), backend=cfg.backend, profile=cfg.profile, world_size=cfg.world_size
    )
    all_samples, summary, memory = [], [], []
    for name in cfg.models:
        for cap in caps_of(name, cfg) if cfg.latency else ():
            samples, row = _latency_point(name, cap, cfg, meta)
            all_samples.append(samples)
            summary.append(row)
            if writer:
                _write_latency(all_samples, summary, out)
        if cfg.memory:
            memory += _memory_rows(name, cfg, meta)
            if writer:
                write_csv_atomic(_memory_frame(memory), out / "memory.csv")
    return {
        "summary": pd.DataFrame(summary),
        "memory": _memory_frame(memory),
        "pooled": pooled(pd.concat(all_samples, ignore_index=True)) if all_samples else pd.DataFrame(),
    }


def _latency_point(name: str, cap: float, cfg: BenchConfig, meta: dict) -> tuple[pd.DataFrame, dict]:
    """One (model, cap) measured on every rank: its samples, and its summary row."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before, t0 = _load(), time.monotonic()
    ranks = launch(
        latency_job,
        cfg.world_size,
        cfg.backend,
        args=(name, cap, cfg),
        timeout_s=cfg.timeout_s,
        threads=cfg.threads_per_rank,
        rank_env=MALLOC_ENV[cfg.malloc],
    )
    point = dict(model=name, bucket_cap_mb=cap)
    samples = pd.DataFrame([{**point, "rank": r["rank"], **s} for r in ranks for s in r["samples"]])
    ours_bytes, torch_bytes = ranks[0]["ours_bucket_bytes"], ranks[0]["torch_bucket_bytes"]
    row = dict(
        point,
        **summarize_point(samples),
        ours_buckets=len(ours_bytes.split()),
        torch_buckets=len(torch_bytes.split()),
        same_buckets=ours_bytes == torch_bytes,
        num_params=ranks[0]["num_params"],
        num_threads=ranks[0]["num_threads"],
        load_before=load_before,
        load_after=_load(),
        point_seconds=time.monotonic() - t0,
        started_at=started,
        malloc=cfg.malloc,
        **meta,
    )
    return samples, row


def _write_latency(all_samples: list[pd.DataFrame], summary: list[dict], out: Path) -> None:
    """The latency CSVs as they stand after each point (an interrupted run keeps what it measured)."""
    every = pd.concat(all_samples, ignore_index=True)
    write_csv_atomic(every, out / "latency_samples.csv")
    write_csv_atomic(pd.DataFrame(summary), out / "summary.csv")
    write_csv_atomic(pooled(every), out / "pooled.csv")
    last = summary[-1]
    print(
        f"[bench] {last['model']} cap={last['bucket_cap_mb']:g} MB: ours/torch = {last['ratio']:.3f}, per round vs "
        f"both torch copies {last['paired_both']:.3f}",
        file=sys.stderr,
    )


def _memory_rows(name: str, cfg: BenchConfig, meta: dict) -> list[dict]:
    """A model's peak memory, one job per (variant, gradient_as_bucket_view): a row each, the worst rank's."""
    rows = []
    for variant, as_view in MEMORY_VARIANTS:
        ranks = launch(
            memory_job,
            cfg.world_size,
            cfg.backend,
            timeout_s=cfg.timeout_s,
            args=(name, cfg.memory_cap_mb, variant, as_view, cfg),
            threads=cfg.threads_per_rank,
            rank_env=SMALL_MMAP_THRESHOLD,
        )
        rows.append(
            dict(
                model=name,
                bucket_cap_mb=cfg.memory_cap_mb,
                variant=variant,
                gradient_as_bucket_view=as_view,
                peak_mb=max(r["peak_mb"] for r in ranks),
                startup_peak_mb=max(r["startup_peak_mb"] for r in ranks),
                param_mb=ranks[0]["param_mb"],
                iters=cfg.memory_iters,
                measure="cuda_max_memory_allocated" if cfg.backend == "nccl" else "peak_rss",
                load=_load(),
                **meta,
            )
        )
    return rows


def _memory_frame(memory: list[dict]) -> pd.DataFrame:
    """Rows plus ``ddp_extra_mb``: steady-state peak above the same model trained without DDP."""
    df = pd.DataFrame(memory)
    if len(df):
        local = df[df["variant"] == "local"].set_index("model")["peak_mb"]
        df.insert(df.columns.get_loc("peak_mb") + 1, "ddp_extra_mb", df["peak_mb"] - df["model"].map(local))
    return df


SUMMARY_COLUMNS = [
    "model",
    "bucket_cap_mb",
    "ours_ms",
    "torch_ms",
    "ratio",
    "ratio_p10",
    "ratio_p90",
    "ratio_ci_lo",
    "ratio_ci_hi",
    "paired_ratio",
    "aa_ratio",
    "ratio_both",
    "paired_both",
    "cpu_ratio",
    "ideal_ms_ours",
    "ours_vs_ideal",
    "ideal_ms_torch",
    "torch_vs_ideal",
    "timing_overhead_pct",
    "faults_ours",
    "faults_torch",
    "load_before",
]
MEMORY_COLUMNS = [
    "model",
    "variant",
    "gradient_as_bucket_view",
    "peak_mb",
    "ddp_extra_mb",
    "startup_peak_mb",
    "param_mb",
    "measure",
]


def format_tables(tables: dict[str, pd.DataFrame]) -> str:
    parts = []
    if len(tables["summary"]):
        parts.append(tables["summary"][SUMMARY_COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if len(tables["pooled"]):
        parts.append(tables["pooled"].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if len(tables["memory"]):
        parts.append(tables["memory"][MEMORY_COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    prog = "python -m experiments bench"

    def body() -> int:
        tables = run_bench(parse_dataclass(BenchConfig, argv, prog=prog))
        if is_writer():
            print(format_tables(tables))
        return 0

    return command_line(prog, body)


if __name__ == "__main__":
    sys.exit(main())
