"""Per-bucket timeline of one iteration: when each bucket's gradients were ready, when its allreduce was
launched and when it truly completed, beside forward and backward, on every rank; also as a Chrome trace.

    make timeline                                   ResNet50, 25 MiB buckets, 2 ranks, CPU default (~1 min)
    python -m experiments timeline --model=bert-base --bucket_cap_mb=5 --net=1gbit
    python -m experiments timeline --help           every option (Config fields)

Runs one point of our DDP with ``trace_buckets`` (``timing="trace"``: completion stamped by a callback on the
communication thread, not clamped to the end of backward), stored under ``results/timeline/`` like any point,
and draws the iteration whose latency is the median of rank 0's: ``results/figures/timeline.png`` and
``results/figures/timeline.trace.json``, which chrome://tracing and https://ui.perfetto.dev open (one process per
rank; threads: compute and communication).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import pandas as pd

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, plotting
from harness import TrainConfig, parse_dataclass, run_sweep
from harness.config import DEFAULT_NET, point_id, validate
from harness.launch.env import is_writer
from harness.launch.errors import command_line

NAME = "timeline"


@dataclass(frozen=True)
class Config:
    """One traced point; every field is a --key=value override."""

    model: str = (
        "resnet50"  # small | resnet50 | resnet101 | bert-base | bert-large | tiny-layers (harness.workloads.models)
    )
    bucket_cap_mb: float = float(DEFAULT_BUCKET_CAP_MB)  # our DDP's bucket cap (MiB)
    world_size: int = 2  # ranks
    backend: str = "auto"  # gloo | nccl | mpi | auto (nccl where CUDA is)
    profile: str = "auto"  # input sizes: paper | cpu | auto (cpu without a GPU)
    iters: int = 5  # measured iterations; the one with rank 0's median latency is drawn
    warmup: int = 2  # iterations run before measuring, never stored
    net: str = DEFAULT_NET  # the link per rank: RATE (e.g. 1gbit) | auto | loopback (harness/README.md)


def point(cfg: Config) -> TrainConfig:
    return TrainConfig(
        model=cfg.model,
        impl="ours",
        bucket_cap_mb=cfg.bucket_cap_mb,
        world_size=cfg.world_size,
        backend=cfg.backend,
        profile=cfg.profile,
        iters=cfg.iters,
        warmup=cfg.warmup,
        net=cfg.net,
        trace_buckets=True,
    )


def median_iteration(df: pd.DataFrame) -> pd.DataFrame:
    """Every rank's row of the iteration whose latency is the median of rank 0's."""
    first = df[df["rank"] == 0].sort_values("total_ms")
    it = first["iteration"].iloc[(len(first) - 1) // 2]
    return df[df["iteration"] == it].sort_values("rank")


def spans(row) -> list[dict]:
    """One iteration of one rank as named spans (ms since its forward start) on a compute or comm thread."""
    t = json.loads(row.bucket_times_json)
    out = [
        dict(name="forward", thread="compute", start=0.0, end=t["forward_end_ms"]),
        dict(name="backward", thread="compute", start=t["backward_start_ms"], end=t["backward_end_ms"]),
    ]
    for b, (ready, launch, done) in enumerate(zip(t["ready_ms"], t["launch_ms"], t["done_ms"])):
        out.append(dict(name=f"bucket {b} waits for launch", thread="comm", start=ready, end=launch))
        out.append(dict(name=f"bucket {b} allreduce", thread="comm", start=launch, end=done))
    return out


def chrome_trace(rows: pd.DataFrame) -> dict:
    """The Chrome trace-event format (complete events, microseconds): a process per rank."""
    events = []
    for row in rows.itertuples():
        for s in spans(row):
            events.append(
                dict(
                    name=s["name"],
                    ph="X",
                    pid=int(row.rank),
                    tid=s["thread"],
                    ts=1e3 * s["start"],
                    dur=1e3 * max(0.0, s["end"] - s["start"]),
                    cat="ddp",
                )
            )
        events.append(dict(name="process_name", ph="M", pid=int(row.rank), args={"name": f"rank {row.rank}"}))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot(rows: pd.DataFrame, cfg: Config):
    buckets = len(json.loads(rows["bucket_times_json"].iloc[0])["launch_ms"])
    fig, axes = plotting.grid([str(r) for r in rows["rank"]], [""], width=9.0, height=0.8 + 0.28 * (buckets + 2))
    for ax, row in zip(axes[:, 0], rows.itertuples()):
        t = json.loads(row.bucket_times_json)
        n = len(t["launch_ms"])
        ax.barh(n + 1, t["forward_end_ms"], color="#4C72B0", label="forward")
        ax.barh(
            n,
            t["backward_end_ms"] - t["backward_start_ms"],
            left=t["backward_start_ms"],
            color="#55A868",
            label="backward",
        )
        for b in range(n):
            y = n - 1 - b
            ax.barh(
                y,
                t["done_ms"][b] - t["launch_ms"][b],
                left=t["launch_ms"][b],
                color="#C44E52",
                label="allreduce (launch to true completion)" if b == 0 else None,
            )
            ax.plot([t["ready_ms"][b]], [y], "k|", ms=10, label="gradients ready" if b == 0 else None)
        ax.axvline(t["backward_end_ms"], color="0.5", ls=":", lw=1, label="end of backward")
        ax.set_yticks(
            [n + 1, n, *range(n)], ["forward", "backward", *[f"bucket {n - 1 - y}" for y in range(n)]], fontsize=7
        )
        ax.set_title(f"rank {row.rank}: iteration {row.iteration}, {row.total_ms:.0f} ms", fontsize=9)
        ax.set_xlabel("ms since forward start")
    # one legend for every rank, beside the first: inside, any corner covers the last buckets or the first
    axes[0][0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    title = (
        f"Per-bucket timeline of one iteration: {cfg.model}, {cfg.bucket_cap_mb:g} MiB buckets, {cfg.world_size} ranks"
    )
    return plotting.finish(
        fig,
        title,
        "Section 3.2 (overlap): buckets launch as they fill during backward, in order",
        rows,
        ". The iteration with rank 0's median latency",
    )


def main(argv=None) -> int:
    prog = "python -m experiments timeline"
    return command_line(prog, lambda: run(parse_dataclass(Config, argv, prog=prog)))


def run(cfg: Config) -> int:
    df = run_sweep(NAME, [point(cfg)])  # refuses a bad value, or ranks this machine cannot hold, before any starts
    if not is_writer():
        return 0
    # this very point's rows: others stored under results/timeline (other iters, profile, backend) are left alone
    df = common.ok_rows(df, net=cfg.net)
    df = df[df["point_id"] == point_id(validate(point(cfg)))]
    if df.empty:
        print(f"[{NAME}] no successful traced point stored; see results/{NAME}/ for the error")
        return 1
    rows = median_iteration(df)
    png = plotting.save(plot(rows, cfg), NAME)
    trace = png.with_name(f"{NAME}.trace.json")
    trace.write_text(json.dumps(chrome_trace(rows)))
    print(f"[{NAME}] wrote {png} (and .pdf) and {trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
