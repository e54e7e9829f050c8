"""`make bench`: is our DDP as fast as torch's C++ Reducer, and how far are both from the ideal bound?

    make bench                                       # ResNet50, BERT-base, tiny-layers; caps 1,5,25,100 MiB
    python -m experiments.bench --models=small --bucket_caps_mb=1,25 --iters=3 --out=/tmp/bench   # seconds
    python -m experiments.bench --help               # every option (BenchConfig fields)

Per (model, cap): torch's DDP, ours, a second torch DDP (A/A control) and no DDP, interleaved in random order
round by round on the same ranks; per (model, variant): peak memory. Writes ``<out>/summary.csv``,
``pooled.csv`` (the number to read), ``latency_samples.csv`` and ``memory.csv``. Methods and findings:
BENCHMARKS.md.
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from harness import env
from harness.config import MODELS, PROFILES, auto_profile_backend, parse_dataclass
from harness.env import is_writer
from harness.errors import command_line, refusing
from harness.allocator import MALLOC_ENV, check_malloc_env
from harness.backends import BACKENDS, check_backend
from harness.launch import RankContext, launch
from harness.memory import PeakMeter, current_bytes
from harness.models import input_spec, make_inputs, seeded_model
from harness.results import git_commit, results_root, write_csv_atomic
from harness.runner import machine_metadata, round_order, timed_iteration
from harness.systems import wrap
from harness.stats import bootstrap_median_ci, pooled_geomean_ci, ratio_of_medians_ci
from harness.timing import ms, stamp

MIB = 1024 * 1024
ORDER = ("torch", "ours", "ours_notiming", "torch_b", "local", "allreduce")
MEMORY_VARIANTS = (("local", False), ("ours", False), ("ours", True), ("torch", False), ("torch", True))


@dataclass(frozen=True)
class BenchConfig:
    """Our DDP vs torch's DDP: per-iteration latency, ideal bound, instrumentation overhead, peak memory."""

    # the models (harness.models); tiny-layers, many tiny gradients, measures DDP's host cost
    models: tuple[str, ...] = ("resnet50", "bert-base", "tiny-layers")
    bucket_caps_mb: tuple[float, ...] = (1.0, 5.0, 25.0, 100.0)  # DDP bucket caps (MiB), a point per model each
    # models measured at cap 0 too: a bucket per gradient, where what DDP pays per bucket is the iteration (pooled
    # apart, as "<model>, a bucket per gradient")
    per_gradient_models: tuple[str, ...] = ("tiny-layers",)  # models also measured at cap 0 (a bucket per gradient)
    iters: int = 20  # measured rounds (one iteration of every variant each)
    warmup: int = 3  # rounds before measuring; >= 2 so both DDPs have rebuilt their buckets
    world_size: int = 0  # ranks; 0: torchrun's, else every visible GPU with NCCL (one is enough), else 2
    backend: str = "auto"  # gloo | nccl | auto (nccl with a GPU)
    profile: str = "auto"  # cpu | paper | auto (paper with a GPU); input sizes, see harness.models
    latency: bool = True  # the interleaved latency points
    memory: bool = True  # peak memory (separate jobs)
    memory_cap_mb: float = 25.0  # the memory jobs' bucket cap (MiB)
    memory_iters: int = 3  # steady-state iterations of each memory job, after the 2 that build the buckets
    threads_per_rank: int = 0  # torch's threads per rank; 0 = cores // ranks
    lr: float = 0.0  # SGD's learning rate; at 0 SGD still does its full update but the weights stay: same work
    seed: int = 0  # the models' initial weights, the inputs and each round's order of variants
    out: str = ""  # output folder; "" = <results>/bench
    timeout_s: float = 600.0  # process group timeout of each job, seconds
    malloc: str = "default"  # glibc's allocator in the ranks: default | retain (freed memory kept), BENCHMARKS.md


def validate_bench(cfg: BenchConfig) -> BenchConfig:
    """Check ``cfg`` before anything is spawned; returns it with ``auto`` profile and backend made concrete."""
    profile, backend = auto_profile_backend(cfg.profile, cfg.backend)
    choices = [("model", m, MODELS) for m in (*cfg.models, *cfg.per_gradient_models)] + [
        ("profile", profile, PROFILES), ("backend", backend, BACKENDS), ("malloc", cfg.malloc, tuple(MALLOC_ENV))]
    for name, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}; choose one of {list(allowed)}")
    if not cfg.models or not cfg.bucket_caps_mb or not all(0 <= c < math.inf for c in cfg.bucket_caps_mb):
        raise ValueError(f"models and bucket_caps_mb must be non-empty, caps finite and >= 0 MiB; got "
                         f"models={cfg.models} bucket_caps_mb={cfg.bucket_caps_mb}")
    if not 0 <= cfg.memory_cap_mb < math.inf:
        raise ValueError(f"memory_cap_mb must be finite and >= 0 MiB, got {cfg.memory_cap_mb}")
    if not (cfg.latency or cfg.memory):
        raise ValueError("latency=false and memory=false: nothing to measure")
    if cfg.threads_per_rank < 0 or not cfg.timeout_s > 0:
        raise ValueError(f"threads_per_rank must be >= 0 (0: cores // ranks) and timeout_s > 0, got "
                         f"{cfg.threads_per_rank} and {cfg.timeout_s}")
    if cfg.world_size == 0:
        cfg = dataclasses.replace(cfg, world_size=env.default_world_size(backend))
    for name, low, why in (("iters", 1, ""), ("warmup", 2, " (both DDPs rebuild their buckets after the first)"),
                           ("world_size", 1, ""), ("memory_iters", 1, "")):
        if getattr(cfg, name) < low:
            raise ValueError(f"{name} must be >= {low}{why}, got {getattr(cfg, name)}")
    check_malloc_env(cfg.malloc)
    return dataclasses.replace(cfg, profile=profile, backend=backend)


# ---------------------------------------------------------------------------------------------- on each rank
def _fresh(name: str, ctx: RankContext, seed: int):
    return seeded_model(name, seed).to(ctx.device)  # built once per rank, copied for each variant


def _iteration(name, model, opt, inputs, ctx: RankContext) -> dict:
    """One timed iteration after a barrier: both ranks start together, so a round's latency is the slower's."""
    dist.barrier(group=ctx.group)
    return timed_iteration(name, model, opt, inputs, ctx)[0]


def _allreduce_all(buffers, ctx: RankContext) -> dict:
    dist.barrier(group=ctx.group)
    t0, c0 = stamp(ctx), time.process_time()
    works = [dist.all_reduce(b, group=ctx.group, async_op=True) for b in buffers]
    for w in works:
        w.wait()
    return dict(total_ms=ms(t0, stamp(ctx)), cpu_ms=(time.process_time() - c0) * 1e3)


def latency_job(ctx: RankContext, name: str, cap_mb: float, cfg: BenchConfig) -> dict:
    """One (model, cap) point on one rank: warmup + measured rounds of every variant, interleaved."""
    spec = input_spec(name, cfg.profile)
    inputs = make_inputs(name, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
    torch_ddp = wrap(_fresh(name, ctx, cfg.seed), "torch", ctx, cap_mb)
    ours = wrap(_fresh(name, ctx, cfg.seed), "ours", ctx, cap_mb)
    torch_b_ddp = wrap(_fresh(name, ctx, cfg.seed), "torch", ctx, cap_mb)
    local = _fresh(name, ctx, cfg.seed)
    opts = {m: torch.optim.SGD(m.parameters(), lr=cfg.lr) for m in (torch_ddp, ours, torch_b_ddp, local)}
    models = {"torch": torch_ddp, "ours": ours, "ours_notiming": ours, "torch_b": torch_b_ddp, "local": local}
    buffers: list[torch.Tensor] = []
    samples = []
    for rnd in range(cfg.warmup + cfg.iters):
        if rnd == cfg.warmup:  # buckets are final now: the allreduce reference uses their sizes
            buffers = [torch.zeros(b.numel, dtype=b.dtype, device=b.device) for b in ours.reducer.buckets]
        for variant in round_order(ORDER, rnd, cfg.seed):
            if variant == "allreduce":
                if buffers:
                    samples.append(dict(variant=variant, round=rnd - cfg.warmup, **_allreduce_all(buffers, ctx)))
                continue
            ours.timing = variant != "ours_notiming"
            model = models[variant]
            row = _iteration(name, model, opts[model], inputs, ctx)
            if rnd >= cfg.warmup:
                samples.append(dict(variant=variant, round=rnd - cfg.warmup, **row))
    logged = torch_ddp._get_ddp_logging_data()  # torch logs its rebuilt bucket sizes (bytes) once it rebuilt
    torch_sizes = str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or "")
    return dict(samples=samples, rank=ctx.rank, num_threads=ctx.num_threads,
                ours_bucket_bytes=" ".join(str(b.nbytes) for b in ours.reducer.buckets),
                torch_bucket_bytes=" ".join(x.strip() for x in torch_sizes.split(",")),
                num_params=sum(p.numel() for p in local.parameters()))


def memory_job(ctx: RankContext, name: str, cap_mb: float, variant: str, as_view: bool, cfg: BenchConfig) -> dict:
    """Peak memory of one variant above what model + inputs hold: while wrapping and through the bucket
    rebuild (first 2 iterations), and in steady state (the next ``memory_iters``)."""
    spec = input_spec(name, cfg.profile)
    inputs = make_inputs(name, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
    model = _fresh(name, ctx, cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    _iteration(name, model, opt, inputs, ctx)  # runtime start-up (thread pools, workspaces) is not DDP's
    model.zero_grad(set_to_none=True)
    del opt
    gc.collect()
    ctx.synchronize()
    before = current_bytes(ctx.device)
    with PeakMeter(ctx.device, before) as startup:
        wrapped = wrap(model, variant, ctx, cap_mb, gradient_as_bucket_view=as_view)
        opt = torch.optim.SGD(wrapped.parameters(), lr=cfg.lr)
        for _ in range(2):
            _iteration(name, wrapped, opt, inputs, ctx)
    with PeakMeter(ctx.device, before) as steady:
        for _ in range(cfg.memory_iters):
            _iteration(name, wrapped, opt, inputs, ctx)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return dict(rank=ctx.rank, startup_peak_mb=startup.peak / MIB, peak_mb=steady.peak / MIB,
                param_mb=param_bytes / MIB)


# ---------------------------------------------------------------------------------------------- parent side
def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _rounds(samples: pd.DataFrame) -> pd.DataFrame:
    """Latency per round (rows) and variant (columns): the slowest rank's."""
    return samples.groupby(["variant", "round"])["total_ms"].max().unstack("variant")


def _per_round(rounds: pd.DataFrame, variant: str, reference: str) -> np.ndarray:
    """variant / reference within each round; ``both`` = the mean of the two torch copies in that round (paired,
    and neither copy's run-long offset favoured, see aa_ratio)."""
    ref = (rounds["torch"] + rounds["torch_b"]) / 2 if reference == "both" else rounds[reference]
    return (rounds[variant] / ref).to_numpy()


def summarize_point(samples: pd.DataFrame) -> dict:
    """Medians, paired ours/torch ratio with spread, ideal bounds and overhead of one point's samples."""
    rounds = _rounds(samples)
    med = samples.groupby("variant")[["forward_ms", "backward_ms", "optimizer_ms"]].median()
    lat = rounds.median()
    paired = rounds["ours"] / rounds["torch"]  # same round: robust when the machine's load drifts between rounds
    paired_both = _per_round(rounds, "ours", "both")
    rng = np.random.default_rng(0)
    ratio_ci = ratio_of_medians_ci(rounds["ours"], rounds["torch"], rng)
    paired_ci, both_ci = bootstrap_median_ci(paired, rng), bootstrap_median_ci(paired_both, rng)
    backward = max(med.loc["local", "backward_ms"], lat["allreduce"])
    ideal = {v: med.loc[v, "forward_ms"] + backward + med.loc[v, "optimizer_ms"] for v in ("ours", "torch")}
    cpu = samples.groupby("variant")["cpu_ms"].median()
    faults = samples.groupby("variant")["minor_faults"].median()
    return dict(
        ours_ms=lat["ours"], torch_ms=lat["torch"], ratio=lat["ours"] / lat["torch"],
        torch_b_ms=lat["torch_b"], aa_ratio=lat["torch_b"] / lat["torch"],
        ratio_both=lat["ours"] / ((lat["torch"] + lat["torch_b"]) / 2),
        ratio_p10=paired.quantile(0.1), ratio_p90=paired.quantile(0.9), ratio_ci_lo=ratio_ci[0],
        ratio_ci_hi=ratio_ci[1], paired_ratio=paired.median(), paired_ci_lo=paired_ci[0], paired_ci_hi=paired_ci[1],
        paired_both=np.median(paired_both), paired_both_ci_lo=both_ci[0], paired_both_ci_hi=both_ci[1],
        ours_notiming_ms=lat["ours_notiming"], timing_overhead_pct=(lat["ours"] / lat["ours_notiming"] - 1) * 100,
        forward_ms_ours=med.loc["ours", "forward_ms"], forward_ms_torch=med.loc["torch", "forward_ms"],
        optimizer_ms_ours=med.loc["ours", "optimizer_ms"], optimizer_ms_torch=med.loc["torch", "optimizer_ms"],
        local_backward_ms=med.loc["local", "backward_ms"], allreduce_ms=lat["allreduce"], local_ms=lat["local"],
        ideal_ms_ours=ideal["ours"], ideal_ms_torch=ideal["torch"],
        ours_vs_ideal=lat["ours"] / ideal["ours"], torch_vs_ideal=lat["torch"] / ideal["torch"],
        cpu_ms_ours=cpu["ours"], cpu_ms_torch=cpu["torch"], cpu_ratio=cpu["ours"] / cpu["torch"],
        faults_ours=faults["ours"], faults_torch=faults["torch"], faults_torch_b=faults["torch_b"],
        rounds=len(rounds),
    )


PER_GRADIENT = ", a bucket per gradient"  # cap 0's points, pooled apart from the model's other caps


def caps_of(name: str, cfg: BenchConfig) -> tuple[float, ...]:
    """The caps a model is measured at: ``bucket_caps_mb``, and 0 for ``per_gradient_models``."""
    extra = (0.0,) if name in cfg.per_gradient_models and 0 not in cfg.bucket_caps_mb else ()
    return (*cfg.bucket_caps_mb, *extra)


def pooled(samples: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One number per model and comparison: its caps pooled (geometric mean of each point's median per-round
    ratio, harness.stats), cap 0 (a bucket per gradient, what DDP pays per bucket) apart from the others. Comparisons: ours and ours_notiming against both torch copies, and the A/A control
    torch_b / torch (what no difference looks like)."""
    rng = np.random.default_rng(seed)
    rows = []
    regime = samples["model"].where(samples["bucket_cap_mb"] > 0, samples["model"] + PER_GRADIENT)
    for name, by_model in samples.groupby(regime, sort=False):
        points = [_rounds(g) for _, g in by_model.groupby("bucket_cap_mb")]
        for variant, reference in (("ours", "both"), ("ours_notiming", "both"), ("torch_b", "torch")):
            per_point = [_per_round(r, variant, reference) for r in points]
            est, lo, hi = pooled_geomean_ci(per_point, rng)
            against = "torch, torch_b" if reference == "both" else reference
            rows.append(dict(model=name, comparison=f"{variant} / {against}", points=len(points),
                             rounds=sum(len(x) for x in per_point), pooled_ratio=est, ci_lo=lo, ci_hi=hi))
    return pd.DataFrame(rows)


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
    meta = dict(machine_metadata(), git_commit=git_commit(), backend=cfg.backend, profile=cfg.profile,
                world_size=cfg.world_size)
    all_samples, summary, memory = [], [], []
    for name in cfg.models:
        for cap in caps_of(name, cfg) if cfg.latency else ():
            started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            load_before, t0 = _load(), time.monotonic()
            ranks = launch(latency_job, cfg.world_size, cfg.backend, args=(name, cap, cfg),
                           timeout_s=cfg.timeout_s, threads=cfg.threads_per_rank, rank_env=MALLOC_ENV[cfg.malloc])
            point = dict(model=name, bucket_cap_mb=cap)
            samples = pd.DataFrame([{**point, "rank": r["rank"], **s} for r in ranks for s in r["samples"]])
            all_samples.append(samples)
            ours_bytes, torch_bytes = ranks[0]["ours_bucket_bytes"], ranks[0]["torch_bucket_bytes"]
            summary.append(dict(point, **summarize_point(samples), ours_buckets=len(ours_bytes.split()),
                                torch_buckets=len(torch_bytes.split()), same_buckets=ours_bytes == torch_bytes,
                                num_params=ranks[0]["num_params"], num_threads=ranks[0]["num_threads"],
                                load_before=load_before, load_after=_load(), point_seconds=time.monotonic() - t0,
                                started_at=started, malloc=cfg.malloc, **meta))
            if writer:
                every = pd.concat(all_samples, ignore_index=True)
                write_csv_atomic(every, out / "latency_samples.csv")
                write_csv_atomic(pd.DataFrame(summary), out / "summary.csv")
                write_csv_atomic(pooled(every), out / "pooled.csv")
                print(f"[bench] {name} cap={cap:g} MB: ours/torch = {summary[-1]['ratio']:.3f}, per round vs both "
                      f"torch copies {summary[-1]['paired_both']:.3f}", file=sys.stderr)
        if cfg.memory:
            for variant, as_view in MEMORY_VARIANTS:
                ranks = launch(memory_job, cfg.world_size, cfg.backend, timeout_s=cfg.timeout_s,
                               args=(name, cfg.memory_cap_mb, variant, as_view, cfg),
                               threads=cfg.threads_per_rank, rank_env=SMALL_MMAP_THRESHOLD)
                memory.append(dict(model=name, bucket_cap_mb=cfg.memory_cap_mb, variant=variant,
                                   gradient_as_bucket_view=as_view, peak_mb=max(r["peak_mb"] for r in ranks),
                                   startup_peak_mb=max(r["startup_peak_mb"] for r in ranks),
                                   param_mb=ranks[0]["param_mb"], iters=cfg.memory_iters,
                                   measure="cuda_max_memory_allocated" if cfg.backend == "nccl" else "peak_rss",
                                   load=_load(), **meta))
            if writer:
                write_csv_atomic(_memory_frame(memory), out / "memory.csv")
    return {"summary": pd.DataFrame(summary), "memory": _memory_frame(memory),
            "pooled": pooled(pd.concat(all_samples, ignore_index=True)) if all_samples else pd.DataFrame()}


def _memory_frame(memory: list[dict]) -> pd.DataFrame:
    """Rows plus ``ddp_extra_mb``: steady-state peak above the same model trained without DDP."""
    df = pd.DataFrame(memory)
    if len(df):
        local = df[df["variant"] == "local"].set_index("model")["peak_mb"]
        df.insert(df.columns.get_loc("peak_mb") + 1, "ddp_extra_mb", df["peak_mb"] - df["model"].map(local))
    return df


SUMMARY_COLUMNS = ["model", "bucket_cap_mb", "ours_ms", "torch_ms", "ratio", "ratio_p10", "ratio_p90",
                   "ratio_ci_lo", "ratio_ci_hi", "paired_ratio", "aa_ratio", "ratio_both", "paired_both", "cpu_ratio",
                   "ideal_ms_ours", "ours_vs_ideal", "ideal_ms_torch", "torch_vs_ideal", "timing_overhead_pct",
                   "faults_ours", "faults_torch", "load_before"]
MEMORY_COLUMNS = ["model", "variant", "gradient_as_bucket_view", "peak_mb", "ddp_extra_mb", "startup_peak_mb",
                  "param_mb", "measure"]


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
    prog = "python -m experiments.bench"

    def body() -> int:
        tables = run_bench(parse_dataclass(BenchConfig, argv, prog=prog))
        if is_writer():
            print(format_tables(tables))
        return 0
    return command_line(prog, body)


if __name__ == "__main__":
    sys.exit(main())
