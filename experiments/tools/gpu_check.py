"""`make gpu-check`: what this suite says, checked on a CUDA machine in one command (about 6 minutes on one H100).

    make gpu-check                                     # any CUDA machine; without CUDA: one line, exit 0
    PYTHONPATH=. python3 -m experiments gpu-check      # a machine with torch preinstalled and no network
    python -m experiments gpu-check --device=cpu --models=small --bench_iters=3   # the same steps on CPU Gloo
    python -m experiments gpu-check --steps=fig7,predict --fig7_iters=20          # part of it again

1. Ours equals torch's DDP on the device (``experiments.parity.device_matrix``, float64 and float32): NCCL over every
   GPU when there are several; with one GPU, Gloo with two ranks sharing it (NCCL refuses two ranks on one GPU).
2. ``make bench`` at world size = number of GPUs (NCCL): ours / torch per (model, cap) with intervals, and the
   cost of ours's instrumentation (timing on / off).
3. A ``fig7`` smoke on NCCL (the caps above, one repetition).
4. ``predict`` for every point fig7 measured, beside its measurement (the first cap of a model probes, the others
   reuse its calibration).
5. ``make autotune``: ``bucket_cap_mb="auto"`` settling beside every fixed cap (three repetitions).

Writes ``<out>/summary.md`` (default ``<results>/gpu-check``) after each step: a step that raises is recorded there
and the rest still run. The bench's CSVs and fig7's results lie beside it (a results root of its own, so a smoke
never mixes into the user's figures). ``--device=cpu`` runs the same steps on Gloo CPU ranks: a rehearsal of the
command, never a GPU result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import parity
from experiments.tools.bench import BenchConfig, run_bench, validate_bench
from experiments.tools.gpu_check_summary import summary_markdown
from harness import load_results
from harness.cli import parse_dataclass
from harness.launch import env
from harness.launch.errors import command_line, refusing
from harness.launch.spawn import launch
from harness.results import results_root

PROG = "python -m experiments gpu-check"
STEPS = ("parity", "bench", "fig7", "predict", "autotune")


@dataclass(frozen=True)
class GpuCheckConfig:
    """Every field is a --key=value override."""

    device: str = "cuda"  # cuda | cpu (the same steps on Gloo CPU ranks)
    models: tuple[str, ...] = ("resnet50", "bert-base", "tiny-layers")  # the models of bench, fig7 and predict
    bucket_caps_mb: tuple[float, ...] = (
        1.0,
        float(DEFAULT_BUCKET_CAP_MB),
    )  # DDP bucket caps (MiB) of bench, fig7 and predict
    bench_iters: int = 20  # the bench's measured rounds
    fig7_iters: int = 5  # fig7's measured iterations per point
    steps: tuple[str, ...] = STEPS  # parity | bench | fig7 | predict | autotune: a subset reruns part of the check
    out: str = ""  # output folder; "" = <results>/gpu-check
    timeout_s: float = 300.0  # process group timeout, seconds; a step's command may run 4x that


def plan(cfg: GpuCheckConfig) -> dict:
    """Backend and world sizes for this machine: NCCL over every GPU, Gloo sharing one GPU for the comparison."""
    if cfg.device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {cfg.device!r}")
    if cfg.bench_iters < 1 or cfg.fig7_iters < 1:
        raise ValueError(f"bench_iters and fig7_iters must be >= 1, got {cfg.bench_iters} and {cfg.fig7_iters}")
    if not cfg.steps or set(cfg.steps) - set(STEPS):
        raise ValueError(f"steps must be a non-empty subset of {','.join(STEPS)}, got {','.join(cfg.steps)}")
    if not cfg.timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {cfg.timeout_s}")
    # models and caps as the bench checks them, before any step (or the GPU's absence) is reached
    validate_bench(BenchConfig(models=cfg.models, bucket_caps_mb=cfg.bucket_caps_mb, backend="gloo", profile="cpu"))
    if cfg.device == "cpu":
        return dict(backend="gloo", world_size=2, parity_backend="gloo", parity_world_size=2, profile="cpu")
    gpus = env.cuda_devices()
    return dict(
        backend="nccl",
        world_size=gpus,
        parity_backend="nccl" if gpus > 1 else "gloo",
        parity_world_size=max(gpus, 2),
        profile="paper",
    )


def _parity_rank(ctx, device: str) -> dict:
    """Rank body: with NCCL each rank's own GPU, with Gloo every rank on ``device`` (one GPU, or the CPU)."""
    return parity.device_matrix(ctx, str(ctx.device) if ctx.backend == "nccl" else device)


def check_parity(cfg: GpuCheckConfig, p: dict) -> dict:
    device = "cuda:0" if cfg.device == "cuda" else "cpu"
    ranks = launch(
        _parity_rank,
        p["parity_world_size"],
        p["parity_backend"],
        args=(device,),
        timeout_s=cfg.timeout_s,
        deadline_s=4 * cfg.timeout_s,
    )
    worst = {case: max(r[case] for r in ranks) for case in ranks[0]}
    bound = {case: 5e-3 if "fp16" in case else 1e-6 for case in worst}
    return dict(worst=worst, failed=[c for c in worst if not worst[c] <= bound[c]], bound=bound)


def _cli(args: list[str], out: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """A suite command in a results root of its own (``out/results``)."""
    run_env = dict(os.environ, DDP_REPRO_RESULTS=str(out / "results"))
    return subprocess.run(
        [sys.executable, "-m", "experiments", *args], capture_output=True, text=True, env=run_env, timeout=timeout_s
    )


def _net(cfg: GpuCheckConfig) -> list[str]:
    """The CPU rehearsal measures over loopback: it rehearses the GPU path, not the CPU default's emulated link."""
    return ["--net=loopback"] if cfg.device == "cpu" else []


def fig7_smoke(cfg: GpuCheckConfig, p: dict, out: Path) -> dict:
    caps = ",".join(f"{c:g}" for c in cfg.bucket_caps_mb)
    proc = _cli(
        [
            "fig7",
            f"--world_size={p['world_size']}",
            f"--backends={p['backend']}",
            f"--profile={p['profile']}",
            f"--models={','.join(cfg.models)}",
            f"--bucket_caps_mb={caps}",
            "--repeats=1",
            f"--iters={cfg.fig7_iters}",
            "--cluster=",
            *_net(cfg),
        ],
        out,
        4 * cfg.timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or [f"fig7 exited {proc.returncode}"])[-1])
    rows = load_results("fig7", out / "results")
    rows = rows[rows["iteration"] >= 0] if "iteration" in rows else rows
    per_point = rows.groupby(["model", "bucket_cap_mb", "iteration"])["total_ms"].max()  # the slowest rank's
    medians = per_point.groupby(["model", "bucket_cap_mb"]).median()
    forward = rows.groupby(["model", "bucket_cap_mb"])["forward_ms"].median()
    return dict(
        median_ms={f"{m} {c:g}": v for (m, c), v in medians.items()},
        forward_ms={f"{m} {c:g}": v for (m, c), v in forward.items()},
    )


def predict_beside(cfg: GpuCheckConfig, p: dict, out: Path, measured: dict) -> list[dict]:
    """Every (model, cap) fig7 measured: the first cap of a model probes, the others reuse its stored calibration."""
    rows = []
    for model in cfg.models:
        for cap in sorted(cfg.bucket_caps_mb, reverse=True):
            proc = _cli(
                [
                    "predict",
                    f"--model={model}",
                    f"--backend={p['backend']}",
                    f"--world_size={p['world_size']}",
                    f"--profile={p['profile']}",
                    f"--bucket_cap_mb={cap:g}",
                    "--json",
                    *_net(cfg),
                ],
                out,
                4 * cfg.timeout_s,
            )
            got = measured.get(f"{model} {cap:g}")
            if proc.returncode != 0:
                rows.append(dict(model=model, cap=cap, error=(proc.stderr.strip().splitlines() or ["?"])[-1]))
                continue
            prediction = json.loads(proc.stdout.strip().splitlines()[-1])
            predicted = prediction["predicted_ms"]
            rows.append(
                dict(
                    model=model,
                    cap=cap,
                    predicted_ms=predicted,
                    host_ms=prediction["host_ms"],
                    measured_ms=got,
                    error_pct=None if got is None else (predicted / got - 1) * 100,
                )
            )
    return rows


def autotune_beside(cfg: GpuCheckConfig, p: dict, out: Path) -> list[dict]:
    """``make autotune`` on this machine's ranks (NCCL on GPUs): where the search settles beside every fixed cap."""
    nets = ["--nets=loopback"] if cfg.device == "cpu" else []
    args = ["autotune", f"--models={','.join(cfg.models)}", f"--world_size={p['world_size']}", *nets]
    proc = _cli([*args, f"--iters={cfg.fig7_iters}"], out, 8 * cfg.timeout_s)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or [f"autotune exited {proc.returncode}"])[-1])
    return pd.read_csv(out / "results" / "autotune" / "summary.csv").to_dict("records")


def _step(fn) -> object:
    """A step's result, or ``{"error": ...}``: one step failing (a driver refusing this device, say) must not cost
    the steps after it their measurements on a machine lent for minutes."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded in the summary and in the exit status
        return dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")


def run(cfg: GpuCheckConfig) -> int:
    with refusing():
        p = plan(cfg)
    if cfg.device == "cuda" and not env.cuda_available():
        print(f"{PROG}: no CUDA GPU here (torch.cuda.is_available() is False): nothing to check", file=sys.stderr)
        return 0
    out = Path(cfg.out) if cfg.out else results_root() / "gpu-check"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    bench_cfg = BenchConfig(
        models=cfg.models,
        bucket_caps_mb=cfg.bucket_caps_mb,
        iters=cfg.bench_iters,
        world_size=p["world_size"],
        backend=p["backend"],
        profile=p["profile"],
        memory=False,
        out=str(out / "bench"),
        timeout_s=cfg.timeout_s,
    )
    steps = {
        "parity": (
            f"ours against torch's DDP ({p['parity_backend']} x {p['parity_world_size']})",
            lambda: check_parity(cfg, p),
        ),
        "bench": ("bench", lambda: run_bench(bench_cfg)),
        "fig7": ("fig7 smoke", lambda: fig7_smoke(cfg, p, out)),
        "predict": ("predict", lambda: predict_beside(cfg, p, out, done.get("fig7", {}).get("median_ms", {}))),
        "autotune": ("autotune", lambda: autotune_beside(cfg, p, out)),
    }
    done: dict = {}
    todo = [step for step in STEPS if step in cfg.steps]
    for i, step in enumerate(todo, 1):
        print(f"[gpu-check] {i}/{len(todo)} {steps[step][0]}", file=sys.stderr)
        done[step] = _step(steps[step][1])
        text = summary_markdown(cfg, p, done, time.monotonic() - t0)
        (out / "summary.md").write_text(text)
    print(text)
    print(f"[gpu-check] written to {out / 'summary.md'}", file=sys.stderr)
    failed = [step for step in todo if isinstance(done[step], dict) and "error" in done[step]]
    return 1 if failed or done.get("parity", {}).get("failed") else 0


def main(argv=None) -> int:
    return command_line(PROG, lambda: run(parse_dataclass(GpuCheckConfig, argv, prog=PROG)))


if __name__ == "__main__":
    sys.exit(main())
