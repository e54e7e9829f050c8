"""`make bench`: is our DDP as fast as torch's C++ Reducer, and how far are both from the ideal?

    make bench                                                   # ResNet50 + BERT-base, caps 1,5,25,100 MB
    python -m harness.bench --models=small --caps=1,25 --iters=3 --warmup=2 --out=/tmp/bench
    python -m harness.bench --help                               # every option (BenchConfig fields)

One spawned job per (model, cap) point. Each rank builds identical copies of the model (same seed) and wraps
one in torch's DDP, one in ours (same ``bucket_cap_mb``) and one more in torch's; a fourth stays unwrapped.
Every *round* runs, on the same inputs and after a barrier, one iteration (forward+loss, backward, SGD step
+ zero_grad) of
    torch       torch.nn.parallel.DistributedDataParallel
    ours        ddp_impl.DistributedDataParallel, instrumentation on (the default the suite uses)
    torch_b     a second torch DDP copy, built after ours: the A/A control. Two identical copies of one model
                can differ by ~5% for a whole run (BERT-base on this CPU, even wrapping one shared module),
                which is more than the difference being measured
    ours_notiming   the same object with ``timing = False``
    local       the unwrapped copy: backward compute with no DDP at all
    allreduce   async allreduces of zero buffers of our bucket sizes, back to back, then wait for all
in a random order drawn per round (the same on every rank), so the impls interleave, see the same load, and
none systematically runs right after itself (warm caches) or after a particular other variant.
Warmup rounds come first (both DDPs rebuild their buckets after their first iteration).

A round's latency is the slowest rank's. Per point: median latency of each variant; ``ratio`` = median
ours / median torch with ``ratio_p10/p90`` (spread of the per-round paired ratios) and a bootstrap 95% CI of
the ratio of medians; ``paired_ratio``, the median of the per-round ratios, with its bootstrap 95% CI;
``aa_ratio`` = median torch_b / median torch (what two identical DDPs differ by: the resolution of ``ratio``)
and ``ratio_both`` = median ours / mean of the two torch medians (built before and after ours), ``paired_both``
the same per round (median, bootstrap CI); the ideal bound forward + max(local backward, allreduce) +
optimizer (each impl's own medians) and ``measured / ideal``; the instrumentation overhead ours / ours_notiming - 1.
``cpu_ms`` (CPU time of all of a rank's threads) is recorded too: unlike wall time it barely moves when other
processes share the cores; ``sys_ms`` and ``minor_faults`` are its kernel part and the pages first touched
in the iteration. On CPU the kernel part is large: glibc hands big freed blocks back to the OS, so every
iteration faults ~70k fresh pages in (BERT-base), a count that shifts with the heap's layout. ``--malloc=retain``
(glibc: never mmap, never trim) keeps freed memory in the process and removes those faults; the default
measures what users get.
Memory (``--memory``): one job per (model, variant), so allocators are not shared. Peak bytes above what the
rank held after building the model and inputs and running one plain iteration (runtime start-up is not DDP's):
CPU: peak resident set (VmHWM, reset through /proc/self/clear_refs), with glibc's mmap threshold at 64 KiB so
freed tensors leave the resident set at once; GPU: ``torch.cuda.max_memory_allocated``. ``startup_peak_mb``
covers wrapping and the first 2 iterations (bucket rebuild), ``peak_mb`` the next ``memory_iters``
(steady state), ``ddp_extra_mb`` = peak_mb minus that of the unwrapped model. Columns: BENCHMARKS.md.
Per model, ``pooled.csv`` combines its caps into one ratio with a CI (``pooled``): the number to read, as a single
point moves by a few percent on a shared CPU. Writes ``<out>/latency_samples.csv``, ``<out>/summary.csv``,
``<out>/pooled.csv``, ``<out>/memory.csv`` (atomically, after each point) and prints the tables.
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import random
import resource
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from harness.config import MODELS, PROFILES, parse_dataclass
from harness.env import in_place, is_writer
from harness.launch import RankContext, launch
from harness.models import build_model, compute_loss, input_spec, make_inputs
from harness.results import git_commit, results_root

MIB = 1024 * 1024
ORDER = ("torch", "ours", "ours_notiming", "torch_b", "local", "allreduce")
MEMORY_VARIANTS = (("local", False), ("ours", False), ("ours", True), ("torch", False), ("torch", True))
MALLOC_ENV = {"default": {}, "retain": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)}}


@dataclass(frozen=True)
class BenchConfig:
    """Our DDP vs torch's DDP: per-iteration latency, ideal bound, instrumentation overhead, peak memory."""

    models: tuple[str, ...] = ("resnet50", "bert-base")
    caps: tuple[float, ...] = (1.0, 5.0, 25.0, 100.0)  # bucket_cap_mb (MiB), one point per (model, cap)
    iters: int = 20  # measured rounds (one iteration of every variant each)
    warmup: int = 3  # rounds before measuring; >= 2 so both DDPs have rebuilt their buckets
    world_size: int = 2
    backend: str = "auto"  # gloo | nccl | auto (nccl with a GPU)
    profile: str = "auto"  # cpu | paper | auto (paper with a GPU); input sizes, see harness.models
    latency: bool = True  # the interleaved latency points
    memory: bool = True  # peak memory (separate jobs)
    memory_cap_mb: float = 25.0
    memory_iters: int = 3
    threads_per_rank: int = 0  # 0 = cores // ranks
    lr: float = 0.0  # SGD still does its full update, but every model keeps the same weights: same work each round
    seed: int = 0
    out: str = ""  # default <results>/bench
    timeout_s: float = 600.0
    malloc: str = "default"  # default | retain: glibc keeps freed memory (no page faults from reuse), see above


def validate_bench(cfg: BenchConfig) -> BenchConfig:
    for m in cfg.models:
        if m not in MODELS:
            raise ValueError(f"unknown model {m!r}; choose from {list(MODELS)}")
    if not cfg.models or not cfg.caps or any(c < 0 for c in cfg.caps):
        raise ValueError("models and caps must be non-empty, caps >= 0")
    if cfg.iters < 1 or cfg.warmup < 2 or cfg.world_size < 2 or cfg.memory_iters < 1:
        raise ValueError("need iters >= 1, warmup >= 2 (bucket rebuild), world_size >= 2, memory_iters >= 1")
    if cfg.malloc not in MALLOC_ENV:
        raise ValueError(f"unknown malloc {cfg.malloc!r}; choose from {list(MALLOC_ENV)}")
    missing = {k: v for k, v in MALLOC_ENV[cfg.malloc].items() if os.environ.get(k) != v}
    if missing and in_place():  # ranks already started: glibc read its settings then
        raise ValueError(f"malloc={cfg.malloc!r} under torchrun/SLURM: export "
                         + " ".join(f"{k}={v}" for k, v in missing.items()) + " before launching")
    cfg = dataclasses.replace(cfg, profile=resolve_profile(cfg.profile), backend=resolve_backend(cfg.backend))
    if cfg.profile not in PROFILES:
        raise ValueError(f"unknown profile {cfg.profile!r}")
    return cfg


def resolve_profile(profile: str) -> str:
    return profile if profile != "auto" else ("paper" if torch.cuda.is_available() else "cpu")


def resolve_backend(backend: str) -> str:
    return backend if backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")


# ---------------------------------------------------------------------------------------------- on each rank
def _wrap(variant: str, model, ctx: RankContext, cap_mb: float, as_view: bool = False):
    if variant == "torch":
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None, process_group=ctx.group,
            bucket_cap_mb=cap_mb, gradient_as_bucket_view=as_view)
    if variant == "ours":
        from ddp_impl import DistributedDataParallel

        return DistributedDataParallel(model, process_group=ctx.group, bucket_cap_mb=cap_mb,
                                       gradient_as_bucket_view=as_view)
    return model


def _fresh(name: str, ctx: RankContext, seed: int):
    torch.manual_seed(seed)
    return build_model(name).to(ctx.device)


def _iteration(name, model, opt, inputs, ctx: RankContext) -> dict:
    dist.barrier(group=ctx.group)
    ctx.synchronize()
    r0 = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this rank (compute + Gloo)
    t0 = time.perf_counter()
    loss = compute_loss(name, model, inputs)
    ctx.synchronize()
    t1 = time.perf_counter()
    loss.backward()
    ctx.synchronize()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=False)
    ctx.synchronize()
    t3 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return dict(forward_ms=(t1 - t0) * 1e3, backward_ms=(t2 - t1) * 1e3, optimizer_ms=(t3 - t2) * 1e3,
                total_ms=(t3 - t0) * 1e3, cpu_ms=(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3,
                sys_ms=(r1.ru_stime - r0.ru_stime) * 1e3, minor_faults=r1.ru_minflt - r0.ru_minflt)


def _allreduce_all(buffers, ctx: RankContext) -> dict:
    dist.barrier(group=ctx.group)
    ctx.synchronize()
    c0, t0 = time.process_time(), time.perf_counter()
    works = [dist.all_reduce(b, group=ctx.group, async_op=True) for b in buffers]
    for w in works:
        w.wait()
    ctx.synchronize()
    return dict(total_ms=(time.perf_counter() - t0) * 1e3, cpu_ms=(time.process_time() - c0) * 1e3)


def latency_job(ctx: RankContext, name: str, cap_mb: float, cfg: BenchConfig) -> dict:
    """One (model, cap) point on one rank: warmup + measured rounds of every variant, interleaved."""
    spec = input_spec(name, cfg.profile)
    inputs = make_inputs(name, spec, ctx.device, seed=cfg.seed * 1000 + ctx.rank)
    theirs = _wrap("torch", _fresh(name, ctx, cfg.seed), ctx, cap_mb)
    ours = _wrap("ours", _fresh(name, ctx, cfg.seed), ctx, cap_mb)
    theirs_b = _wrap("torch", _fresh(name, ctx, cfg.seed), ctx, cap_mb)
    local = _fresh(name, ctx, cfg.seed)
    opts = {m: torch.optim.SGD(m.parameters(), lr=cfg.lr) for m in (theirs, ours, theirs_b, local)}
    models = {"torch": theirs, "ours": ours, "ours_notiming": ours, "torch_b": theirs_b, "local": local}
    buffers: list[torch.Tensor] = []
    samples = []
    for rnd in range(cfg.warmup + cfg.iters):
        if rnd == cfg.warmup:  # buckets are final now: the allreduce reference uses their sizes
            buffers = [torch.zeros(b.numel, dtype=b.dtype, device=b.device) for b in ours.reducer.buckets]
        for variant in random.Random(cfg.seed * 1000 + rnd).sample(ORDER, len(ORDER)):
            if variant == "allreduce":
                if buffers:
                    samples.append(dict(variant=variant, round=rnd - cfg.warmup, **_allreduce_all(buffers, ctx)))
                continue
            ours.timing = variant != "ours_notiming"
            model = models[variant]
            row = _iteration(name, model, opts[model], inputs, ctx)
            if rnd >= cfg.warmup:
                samples.append(dict(variant=variant, round=rnd - cfg.warmup, **row))
    logged = theirs._get_ddp_logging_data()  # torch logs its rebuilt bucket sizes (bytes) once it rebuilt
    torch_sizes = str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or "")
    return dict(samples=samples, rank=ctx.rank, num_threads=ctx.num_threads,
                ours_bucket_bytes=" ".join(str(b.nbytes) for b in ours.reducer.buckets),
                torch_bucket_bytes=" ".join(x.strip() for x in torch_sizes.split(",")),
                num_params=sum(p.numel() for p in local.parameters()))


def _memory_now(ctx: RankContext) -> tuple[int, int]:
    """(current, peak) bytes: CUDA allocator stats on GPU, resident set size (VmRSS, VmHWM) on CPU."""
    if ctx.device.type == "cuda":
        return torch.cuda.memory_allocated(ctx.device), torch.cuda.max_memory_allocated(ctx.device)
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731
    return kib("VmRSS"), kib("VmHWM")


def _reset_peak(ctx: RankContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS


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
    before, _ = _memory_now(ctx)
    _reset_peak(ctx)
    wrapped = _wrap(variant, model, ctx, cap_mb, as_view)
    opt = torch.optim.SGD(wrapped.parameters(), lr=cfg.lr)
    peaks = []
    for iters in (2, cfg.memory_iters):
        for _ in range(iters):
            _iteration(name, wrapped, opt, inputs, ctx)
        ctx.synchronize()
        peaks.append(_memory_now(ctx)[1])
        _reset_peak(ctx)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return dict(rank=ctx.rank, startup_peak_mb=(peaks[0] - before) / MIB, peak_mb=(peaks[1] - before) / MIB,
                param_mb=param_bytes / MIB)


# ---------------------------------------------------------------------------------------------- parent side
def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "") if Path("/proc/cpuinfo").exists() else ""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return dict(hostname=socket.gethostname(), cpu=cpu, cores=os.cpu_count(), gpu=gpu,
                torch_version=torch.__version__, git_commit=git_commit())


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


def _boot_medians(x: np.ndarray, rng, n: int = 2000) -> np.ndarray:
    return np.median(x[rng.integers(0, len(x), size=(n, len(x)))], axis=1)


def summarize_point(samples: pd.DataFrame) -> dict:
    """Medians, paired ours/torch ratio with spread, ideal bounds and overhead of one point's samples."""
    rounds = _rounds(samples)
    med = samples.groupby("variant")[["forward_ms", "backward_ms", "optimizer_ms"]].median()
    lat = rounds.median()
    paired = rounds["ours"] / rounds["torch"]  # same round: robust when the machine's load drifts between rounds
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(rounds), size=(2000, len(rounds)))
    boot = np.median(rounds["ours"].to_numpy()[idx], axis=1) / np.median(rounds["torch"].to_numpy()[idx], axis=1)
    boot_paired = np.median(paired.to_numpy()[idx], axis=1)
    paired_both = _per_round(rounds, "ours", "both")
    boot_both = _boot_medians(paired_both, rng)
    backward = max(med.loc["local", "backward_ms"], lat["allreduce"])
    ideal = {v: med.loc[v, "forward_ms"] + backward + med.loc[v, "optimizer_ms"] for v in ("ours", "torch")}
    cpu = samples.groupby("variant")["cpu_ms"].median()
    faults = samples.groupby("variant")["minor_faults"].median()
    return dict(
        ours_ms=lat["ours"], torch_ms=lat["torch"], ratio=lat["ours"] / lat["torch"],
        torch_b_ms=lat["torch_b"], aa_ratio=lat["torch_b"] / lat["torch"],
        ratio_both=lat["ours"] / ((lat["torch"] + lat["torch_b"]) / 2),
        ratio_p10=paired.quantile(0.1), ratio_p90=paired.quantile(0.9),
        ratio_ci_lo=np.quantile(boot, 0.025), ratio_ci_hi=np.quantile(boot, 0.975),
        paired_ratio=paired.median(), paired_ci_lo=np.quantile(boot_paired, 0.025),
        paired_ci_hi=np.quantile(boot_paired, 0.975),
        paired_both=np.median(paired_both), paired_both_ci_lo=np.quantile(boot_both, 0.025),
        paired_both_ci_hi=np.quantile(boot_both, 0.975),
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


def pooled(samples: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One number per model and comparison: the geometric mean over its caps of each point's median per-round
    ratio, with a bootstrap 95% CI (rounds resampled within each point). A single point moves by +-3 % here
    (BENCHMARKS.md); pooling the caps resolves about 1 %. Comparisons: ours and ours_notiming against both
    torch copies, and the A/A control torch_b / torch (what no difference looks like)."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, by_model in samples.groupby("model", sort=False):
        points = [_rounds(g) for _, g in by_model.groupby("bucket_cap_mb")]
        for variant, reference in (("ours", "both"), ("ours_notiming", "both"), ("torch_b", "torch")):
            per_point = [_per_round(r, variant, reference) for r in points]
            est = np.exp(np.mean([np.log(np.median(x)) for x in per_point]))
            boot = np.exp(np.mean([np.log(_boot_medians(x, rng)) for x in per_point], axis=0))
            against = "torch, torch_b" if reference == "both" else reference
            rows.append(dict(model=name, comparison=f"{variant} / {against}", points=len(points),
                             rounds=sum(len(x) for x in per_point), pooled_ratio=est,
                             ci_lo=np.quantile(boot, 0.025), ci_hi=np.quantile(boot, 0.975)))
    return pd.DataFrame(rows)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """Atomic: a temporary file in the same folder, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            df.to_csv(fh, index=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _small_mmap_threshold():
    """Spawned ranks get glibc's mmap threshold at 64 KiB, so a freed tensor's pages go back to the OS at once
    and the resident set tracks live tensors (with the default, freed memory stays resident and peaks blur)."""
    return mock.patch.dict(os.environ, {"MALLOC_MMAP_THRESHOLD_": "65536"})


def run_bench(cfg: BenchConfig) -> dict[str, pd.DataFrame]:
    """Run every point (and the memory jobs); write the CSVs after each; return the tables."""
    cfg = validate_bench(cfg)
    writer = is_writer()  # under torchrun every rank runs this; rank 0 writes
    out = Path(cfg.out) if cfg.out else results_root() / "bench"
    meta = dict(machine(), backend=cfg.backend, profile=cfg.profile, world_size=cfg.world_size)
    all_samples, summary, memory = [], [], []
    for name in cfg.models:
        for cap in cfg.caps if cfg.latency else ():
            started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            load_before, t0 = _load(), time.monotonic()
            with mock.patch.dict(os.environ, MALLOC_ENV[cfg.malloc]):
                ranks = launch(latency_job, cfg.world_size, cfg.backend, args=(name, cap, cfg),
                               timeout_s=cfg.timeout_s, threads=cfg.threads_per_rank)
            point = dict(model=name, bucket_cap_mb=cap)
            samples = pd.DataFrame([{**point, "rank": r["rank"], **s} for r in ranks for s in r["samples"]])
            all_samples.append(samples)
            info = ranks[0]
            summary.append(dict(point, **summarize_point(samples),
                                ours_buckets=len(info["ours_bucket_bytes"].split()),
                                torch_buckets=len(info["torch_bucket_bytes"].split()),
                                same_buckets=info["ours_bucket_bytes"] == info["torch_bucket_bytes"],
                                num_params=info["num_params"],
                                num_threads=info["num_threads"], load_before=load_before, load_after=_load(),
                                point_seconds=time.monotonic() - t0, started_at=started, malloc=cfg.malloc,
                                **meta))
            if writer:
                write_csv(pd.concat(all_samples, ignore_index=True), out / "latency_samples.csv")
                write_csv(pd.DataFrame(summary), out / "summary.csv")
                write_csv(pooled(pd.concat(all_samples, ignore_index=True)), out / "pooled.csv")
                print(f"[bench] {name} cap={cap:g} MB: ours/torch = {summary[-1]['ratio']:.3f}, per round vs both "
                      f"torch copies {summary[-1]['paired_both']:.3f}", file=sys.stderr)
        if cfg.memory:
            for variant, as_view in MEMORY_VARIANTS:
                with _small_mmap_threshold():
                    ranks = launch(memory_job, cfg.world_size, cfg.backend, timeout_s=cfg.timeout_s,
                                   args=(name, cfg.memory_cap_mb, variant, as_view, cfg),
                                   threads=cfg.threads_per_rank)
                memory.append(dict(model=name, bucket_cap_mb=cfg.memory_cap_mb, variant=variant,
                                   gradient_as_bucket_view=as_view,
                                   peak_mb=max(r["peak_mb"] for r in ranks),
                                   startup_peak_mb=max(r["startup_peak_mb"] for r in ranks),
                                   param_mb=ranks[0]["param_mb"], iters=cfg.memory_iters,
                                   measure="cuda_max_memory_allocated" if cfg.backend == "nccl" else "peak_rss",
                                   load=_load(), **meta))
            if writer:
                write_csv(_memory_frame(memory), out / "memory.csv")
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
    cfg = parse_dataclass(BenchConfig, argv, prog="python -m harness.bench")
    tables = run_bench(cfg)
    if is_writer():
        print(format_tables(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
