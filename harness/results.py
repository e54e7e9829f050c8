"""The one results schema, its atomic per-point store, the loader and ``summarize``.

Layout: ``<root>/<experiment>/points/<point_id>.csv``, one tidy CSV per point with one row per
(rank, measured iteration), or a single row with ``error`` set when the point failed. Each file is written
to a temporary name in the same folder and renamed with ``os.replace``, so a file either holds a whole point
or does not exist: a killed sweep loses at most the point in flight and never leaves a half-written one.
``<root>`` is ``results/`` in the repository unless ``root`` or ``$DDP_REPRO_RESULTS`` says otherwise; figures go
to ``<root>/figures/`` unless ``$DDP_REPRO_FIGURES`` says otherwise (:func:`figures_dir`).
Every column is defined in ``results/README.md``. CSV only; nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
import typing
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from harness.config import AllreduceConfig, ConvergenceConfig, TrainConfig
from harness.workloads.memory import CATEGORIES

REPO_ROOT = Path(__file__).resolve().parents[1]
TMP_PREFIX = ".tmp-"

_DTYPES = {int: "Int64", float: "float64", bool: "boolean", str: "string", float | str: "float64"}  # "auto": NaN


def _config_columns() -> dict[str, str]:
    cols: dict[str, str] = {}
    for cls in (TrainConfig, AllreduceConfig, ConvergenceConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            cols.setdefault(f.name, _DTYPES[hints[f.name]])
    return cols


# name -> pandas dtype, in file order. Descriptions live in results/README.md (a test keeps them in sync).
SCHEMA: dict[str, str] = {
    "experiment": "string",
    "point_id": "string",
    "point_type": "string",
    "rank": "Int64",
    "iteration": "Int64",
    **_config_columns(),
    # network emulation (harness.netem.shaping, harness.netem.autorate): the rate applied for the point's `net`
    "net_rate_mbit": "float64",
    "net_auto_backward_ms": "float64",
    "net_auto_loopback": "boolean",
    # training iteration (harness.workloads.runner)
    "synced": "boolean",
    "loss": "float64",
    "forward_ms": "float64",
    "backward_ms": "float64",
    "backward_compute_ms": "float64",
    "backward_comm_exposed_ms": "float64",
    "optimizer_ms": "float64",
    "total_ms": "float64",
    "cpu_ms": "float64",
    "sys_ms": "float64",
    "minor_faults": "Int64",
    "ddp_forward_compute_ms": "float64",
    "ddp_backward_compute_ms": "float64",
    "ddp_backward_comm_ms": "float64",
    "ddp_overlap_ms": "float64",
    "breakdown_source": "string",
    "bucket_times_json": "string",
    # bucket_cap_mb="auto" (ddp_impl.autotune): the cap it settled on, after how many iterations, the search's log
    "autotune": "boolean",
    "bucket_cap_mb_used": "float64",
    "autotune_iterations": "Int64",
    "autotune_ms": "float64",
    "autotune_json": "string",
    "num_params": "Int64",
    "batch_size_used": "Int64",
    "image_size": "Int64",
    "seq_len": "Int64",
    # memory and traffic per rank (TrainConfig.memory; harness.workloads.memory), the same on every row of a rank
    **{f"mem_{c}_bytes": "Int64" for c in CATEGORIES},
    "mem_profiled_peak_bytes": "Int64",
    "mem_measured_peak_bytes": "Int64",
    "mem_model_state_bytes": "Int64",
    "sent_bytes": "Int64",
    "mem_timeline_json": "string",
    # allreduce microbenchmark (harness.workloads.collectives); total_ms is shared
    "num_calls": "Int64",
    "total_bytes": "Int64",
    "call_ms": "float64",
    "algbw_gbps": "float64",
    "busbw_gbps": "float64",
    # convergence on real data (harness.workloads.convergence); synced, loss, num_params, batch_size_used are shared
    "epoch": "float64",
    "accuracy": "float64",
    "test_loss": "float64",
    "test_accuracy": "float64",
    "train_size": "Int64",
    "test_size": "Int64",
    # run metadata
    "torch_version": "string",
    "hostname": "string",
    "device_name": "string",
    "num_threads": "Int64",
    "git_commit": "string",
    "started_at": "string",
    "point_seconds": "float64",
    "order_seed": "Int64",
    "run_position": "Int64",
    "group": "string",
    "round_position": "Int64",
    "error": "string",
    "failed_rank": "Int64",
    "cause": "string",
}

ALWAYS = ("experiment", "point_id", "point_type", "rank", "iteration", "error")

METRICS = (
    "forward_ms",
    "backward_ms",
    "backward_compute_ms",
    "backward_comm_exposed_ms",
    "optimizer_ms",
    "total_ms",
    "ddp_backward_comm_ms",
    "ddp_overlap_ms",
    "loss",
    "call_ms",
    "algbw_gbps",
    "busbw_gbps",
    "accuracy",
    "test_accuracy",
)


def results_root(root: str | os.PathLike | None = None) -> Path:
    return Path(root or os.environ.get("DDP_REPRO_RESULTS") or REPO_ROOT / "results")


REFERENCE = REPO_ROOT / "results" / "reference"  # the committed reference run (its figures are tracked too)


def figures_dir(root: str | os.PathLike | None = None) -> Path:
    """Where figures are written: ``$DDP_REPRO_FIGURES`` if set, else ``<root>/figures/``, except for the committed
    reference run: redrawing it (``DDP_REPRO_RESULTS=results/reference``) writes to ``results/figures/reference/``,
    which git ignores, so a redraw never dirties the tree. To refresh the tracked figures on purpose, set
    ``DDP_REPRO_FIGURES=results/reference/figures``."""
    if os.environ.get("DDP_REPRO_FIGURES"):
        return Path(os.environ["DDP_REPRO_FIGURES"])
    base = results_root(root)
    if base.resolve() == REFERENCE.resolve():
        return REPO_ROOT / "results" / "figures" / "reference"
    return base / "figures"


def points_dir(experiment: str, root=None) -> Path:
    if not experiment or "/" in experiment or experiment.startswith("."):
        raise ValueError(f"bad experiment name {experiment!r}")
    return results_root(root) / experiment / "points"


def point_path(experiment: str, point_id: str, root=None) -> Path:
    return points_dir(experiment, root) / f"{point_id}.csv"


def git_commit() -> str:
    """HEAD of the repository, '+dirty' if the tree has changes; '' when unknown (no git, no commit)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def to_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """Rows -> DataFrame with schema columns (those present, plus ALWAYS) in schema order and dtypes."""
    unknown = sorted({k for row in rows for k in row} - SCHEMA.keys())
    if unknown:
        raise ValueError(f"columns not in harness.results.SCHEMA: {unknown}")
    present = {k for row in rows for k in row} | set(ALWAYS)
    df = pd.DataFrame(list(rows)).reindex(columns=[c for c in SCHEMA if c in present])
    return _apply_dtypes(df)


def _apply_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    for col in df.columns:
        dtype = SCHEMA.get(col)
        if dtype == "string":
            df[col] = df[col].astype("string").fillna("")
        elif dtype == "boolean":
            df[col] = df[col].map(lambda v: v if pd.isna(v) or isinstance(v, bool) else str(v) == "True")
            df[col] = df[col].astype("boolean")
        elif dtype is not None:
            df[col] = df[col].astype(dtype)
    return df


def write_point(experiment: str, point_id: str, rows: Sequence[dict], root=None) -> Path:
    """Store one point's rows atomically (:func:`write_csv_atomic`); returns the file's path."""
    if not rows:
        raise ValueError(f"point {point_id} has no rows to store")
    df = to_frame([{**row, "experiment": experiment, "point_id": point_id} for row in rows])
    path = point_path(experiment, point_id, root)
    write_csv_atomic(df, path)
    return path


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` to ``path`` so that readers (and a sweep killed mid-write) see the old file or the whole new
    one, never a part: a ``.tmp-`` file in the same folder, fsync, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            df.to_csv(fh, index=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_point_file(path: Path) -> pd.DataFrame:
    return _apply_dtypes(_read_csv(path))


def _read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(
        path, keep_default_na=False, na_values=[""], dtype={c: "string" for c, t in SCHEMA.items() if t == "string"}
    )


def _point_files(experiment: str, root=None) -> list[Path]:
    folder = points_dir(experiment, root)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.csv") if not p.name.startswith(TMP_PREFIX))


def stored_point_ids(experiment: str, root=None) -> set[str]:
    return {p.stem for p in _point_files(experiment, root)}


def failed_point_ids(experiment: str, root=None) -> set[str]:
    """Stored points whose file records an error."""
    failed = set()
    for p in _point_files(experiment, root):
        errors = read_point_file(p).get("error")
        if errors is not None and (errors != "").any():
            failed.add(p.stem)
    return failed


def load_results(experiment: str, root=None) -> pd.DataFrame:
    """All stored points of ``experiment`` as one DataFrame (schema order and dtypes, applied once to all: per
    file they took most of the time; empty if none)."""
    frames = [_read_csv(p) for p in _point_files(experiment, root)]
    if not frames:
        return _apply_dtypes(pd.DataFrame(columns=list(ALWAYS)))
    df = pd.concat(frames, ignore_index=True)
    return _apply_dtypes(df.reindex(columns=[c for c in SCHEMA if c in df.columns]))


def summarize(
    df: pd.DataFrame, by: Iterable[str], metrics: Iterable[str] | None = None, percentiles: Sequence[int] = (10, 50, 90)
) -> pd.DataFrame:
    """Percentiles (and mean) of each metric over all ranks and measured iterations of each group.

    Rows with ``error`` set are dropped. Warmup iterations are never stored, so nothing else is excluded.
    Columns: ``by``..., ``n`` (rows in the group), then ``<metric>_p<q>`` and ``<metric>_mean``.
    """
    by = list(by)
    ok = df[df["error"].fillna("") == ""] if "error" in df.columns else df
    if metrics is None:
        metrics = [m for m in METRICS if m in ok.columns and ok[m].notna().any()]
    metrics = list(metrics)
    grouped = ok.groupby(by, dropna=False, sort=True)
    parts = {"n": grouped.size()}
    for m in metrics:
        values = grouped[m]
        for q in percentiles:
            parts[f"{m}_p{q}"] = values.quantile(q / 100)
        parts[f"{m}_mean"] = values.mean()
    return pd.DataFrame(parts).reset_index()
