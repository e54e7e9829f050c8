"""Where DDP's cost per bucket goes: ours and torch's DDP at a bucket per gradient beside one bucket, and each step
of ours's per-bucket path beside the floor that any Python caller pays.

    python -m experiments bucket-cost                       # tiny-layers, 1 rank (the collective moves no bytes)
    python -m experiments bucket-cost --world_size=2

Per round, in a random order, one iteration of torch's DDP and of ours at cap 0 (a bucket per gradient) and at one
bucket (a cap above the model's size), of ours at cap 0 with its timing off, and of the model alone. A DDP's cost
per bucket is its iteration at cap 0 less its iteration at one bucket, over the buckets added, per round: the
median with its 95% interval. Then, on the model's gradients, each step of a bucket's path timed alone over every
bucket, the steps in a random order per round:

* ``floor``: ``ProcessGroup.allreduce([bucket])`` and waiting on its work: what any Python caller pays;
* ``fill``: the gradient, averaged, into its bucket (one multiply, issued from Python);
* ``write_back``: the bucket's average back into ``.grad`` (one copy, issued from Python).

``floor`` is also a variant of the iterations: :class:`FloorDDP`, the least a DDP in Python does per bucket. Ours's
cost per bucket less the three steps is its Python bookkeeping (hooks to launch, the end of backward). Writes
``<results>/bucket_cost/per_bucket.csv`` (per world size and DDP: ``us_per_bucket`` with ``ci_lo/hi``,
``us_over_local_per_bucket``, ``over_torch`` and ``over_floor`` with their intervals, ``buckets``) and ``steps.csv``
(per world size and step: ``us_per_bucket``, ``ci_lo/hi``), each row with the model, rounds, commit and machine; a
run replaces its world size's rows. ``make report`` shows the committed ones.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from ddp_impl import DDPOptions
from experiments.stats import bootstrap_median_ci
from experiments.tools.floor_ddp import FloorDDP
from harness.cli import parse_dataclass
from harness.launch.errors import command_line, refusing
from harness.launch.spawn import RankContext, launch
from harness.results import git_commit, results_root, write_csv_atomic
from harness.workloads.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.workloads.runner import machine_metadata
from harness.workloads.systems import wrap

EXPERIMENT = "bucket_cost"
ONE_BUCKET_MB = 1024.0  # above any model here: one bucket
VARIANTS = (
    ("torch", 0.0),
    ("torch", ONE_BUCKET_MB),
    ("ours", 0.0),
    ("ours", ONE_BUCKET_MB),
    ("ours_notiming", 0.0),
    ("ours_notiming", ONE_BUCKET_MB),
    ("floor", 0.0),
    ("local", 0.0),
)
STEPS = ("floor", "fill", "write_back")


@dataclass(frozen=True)
class Config:
    """Ours's and torch's DDP cost per bucket, and ours's path step by step."""

    model: str = (
        "tiny-layers"  # the model (harness.workloads.models): tiny-layers has 800 tiny gradients, so 800 buckets
    )
    world_size: int = 1  # ranks (Gloo on CPU): 1, where the collective moves no bytes, or 2
    rounds: int = 150  # measured rounds of the iterations (one of every variant each), and of the steps
    warmup: int = 5  # rounds before measuring (both DDPs rebuild their buckets after the first)
    seed: int = 0  # the model's weights, the inputs and each round's order
    timeout_s: float = 300.0  # process group timeout, seconds


def _variant(name: str, cap: float, ctx: RankContext, cfg: Config):
    if name == "floor":
        model = FloorDDP(seeded_model(cfg.model, cfg.seed), ctx.group or dist.group.WORLD, ctx.world_size)
        return model, torch.optim.SGD(model.parameters(), lr=0.0)
    impl, options = ("ours" if name == "ours_notiming" else name), DDPOptions(cap, timing=name != "ours_notiming")
    model = wrap(seeded_model(cfg.model, cfg.seed), impl, ctx, options)
    return model, torch.optim.SGD(model.parameters(), lr=0.0)


def rank_job(ctx: RankContext, cfg: Config) -> dict:
    """On every rank: the interleaved iterations, then the steps; returns per-round milliseconds."""
    inputs = make_inputs(cfg.model, input_spec(cfg.model, "cpu"), ctx.device, cfg.seed + ctx.rank)
    variants = {v: _variant(*v, ctx, cfg) for v in VARIANTS}
    rng = random.Random(cfg.seed)
    iterations = _time_iterations(variants, inputs, ctx, cfg, rng)
    buckets = {cap: len(variants[("ours", cap)][0].reducer.buckets) for cap in (0.0, ONE_BUCKET_MB)}  # rebuilt
    per_step = _time_steps(variants[("ours", 0.0)][0], ctx, cfg, rng)
    return dict(
        rank=ctx.rank, iterations=iterations, steps=per_step, buckets=buckets[0.0], one_bucket=buckets[ONE_BUCKET_MB]
    )


def _time_iterations(variants: dict, inputs, ctx: RankContext, cfg: Config, rng: random.Random) -> dict:
    """Every variant's iteration once a round, in a shuffled order: milliseconds per measured round."""
    iterations = {f"{n}@{c:g}": [] for n, c in VARIANTS}
    for r in range(cfg.warmup + cfg.rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        for v in order:
            model, opt = variants[v]
            dist.barrier(group=ctx.group)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            compute_loss(cfg.model, model, inputs).backward()
            opt.step()
            if r >= cfg.warmup:
                iterations[f"{v[0]}@{v[1]:g}"].append((time.perf_counter() - t0) * 1e3)
    return iterations


def _time_steps(ours, ctx: RankContext, cfg: Config, rng: random.Random) -> dict:
    """Each step of a bucket's path alone, over ``ours``'s gradients as buckets of their own, in a shuffled order
    per round: microseconds per bucket per measured round."""
    grads = [p.grad.detach().clone() for p in ours.module.parameters()]
    flats = [torch.zeros(g.numel(), dtype=g.dtype, device=g.device) for g in grads]
    views = [f.view_as(g) for f, g in zip(flats, grads)]
    group = ctx.group if ctx.group is not None else dist.group.WORLD
    factor, opts = torch.tensor(1.0 / ctx.world_size, dtype=grads[0].dtype), dist.AllreduceOptions()

    def floor():
        works = [group.allreduce([f], opts) for f in flats]
        for w in works:
            w.wait()

    def fill():
        for g, v in zip(grads, views):
            torch.mul(g, factor, out=v)

    def write_back():
        for g, v in zip(grads, views):
            g.copy_(v)

    steps = {"floor": floor, "fill": fill, "write_back": write_back}
    per_step = {s: [] for s in STEPS}
    for r in range(cfg.warmup + cfg.rounds):
        order = list(STEPS)
        rng.shuffle(order)
        for s in order:
            dist.barrier(group=ctx.group)
            t0 = time.perf_counter()
            steps[s]()
            if r >= cfg.warmup:
                per_step[s].append((time.perf_counter() - t0) * 1e6 / len(flats))
    return per_step


def _spread(values, rng) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=float)
    lo, hi = bootstrap_median_ci(x, rng)
    return float(np.median(x)), lo, hi


def summarize(ranks: list[dict], cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per DDP: its cost per added bucket, what it adds to the model alone per bucket at a bucket per gradient (us),
    and its iteration there over torch's; per step: us per bucket), each the median over rounds of the slower
    rank's times, with its 95% interval."""
    rng = np.random.default_rng(cfg.seed)
    slowest = {k: np.max([r["iterations"][k] for r in ranks], axis=0) for k in ranks[0]["iterations"]}
    added = ranks[0]["buckets"] - ranks[0]["one_bucket"]
    meta = dict(
        model=cfg.model, world_size=cfg.world_size, rounds=cfg.rounds, git_commit=git_commit(), **machine_metadata()
    )
    rows = []
    for name in ("torch", "ours", "ours_notiming", "floor"):
        one = slowest[f"{'torch' if name == 'floor' else name}@{ONE_BUCKET_MB:g}"]  # floor: against torch's one bucket
        us, lo, hi = _spread((slowest[f"{name}@0"] - one) / added * 1e3, rng)
        over_local = float(np.median(slowest[f"{name}@0"] - slowest["local@0"])) / ranks[0]["buckets"] * 1e3
        ratio, rlo, rhi = _spread(slowest[f"{name}@0"] / slowest["torch@0"], rng)
        floor, flo, fhi = _spread(slowest[f"{name}@0"] / slowest["floor@0"], rng)
        rows.append(
            dict(
                ddp=name,
                us_per_bucket=us,
                ci_lo=lo,
                ci_hi=hi,
                us_over_local_per_bucket=over_local,
                over_torch=ratio,
                over_torch_lo=rlo,
                over_torch_hi=rhi,
                over_floor=floor,
                over_floor_lo=flo,
                over_floor_hi=fhi,
                buckets=ranks[0]["buckets"],
                **meta,
            )
        )
    steps = []
    for s in STEPS:
        us, lo, hi = _spread(np.max([r["steps"][s] for r in ranks], axis=0), rng)
        steps.append(dict(step=s, us_per_bucket=us, ci_lo=lo, ci_hi=hi, **meta))
    return pd.DataFrame(rows), pd.DataFrame(steps)


def main(argv: list[str] | None = None) -> int:
    prog = "python -m experiments bucket-cost"

    def body() -> int:
        cfg = parse_dataclass(Config, argv, prog=prog)
        with refusing():
            if cfg.world_size not in (1, 2) or cfg.rounds < 1 or cfg.warmup < 2:
                raise ValueError(
                    f"world_size must be 1 or 2, rounds >= 1 and warmup >= 2; got {cfg.world_size}, "
                    f"{cfg.rounds}, {cfg.warmup}"
                )
        ranks = launch(rank_job, cfg.world_size, "gloo", args=(cfg,), timeout_s=cfg.timeout_s, threads=1)
        per_bucket, steps = summarize(ranks, cfg)
        out = results_root() / EXPERIMENT
        for name, table in (("per_bucket", per_bucket), ("steps", steps)):
            path = out / f"{name}.csv"
            old = pd.read_csv(path) if path.exists() else pd.DataFrame()
            kept = old[old["world_size"] != cfg.world_size] if len(old) else old
            write_csv_atomic(pd.concat([kept, table], ignore_index=True), path)
        print(
            per_bucket[
                [
                    "ddp",
                    "us_per_bucket",
                    "ci_lo",
                    "ci_hi",
                    "us_over_local_per_bucket",
                    "over_torch",
                    "over_torch_lo",
                    "over_torch_hi",
                    "over_floor",
                    "buckets",
                ]
            ].to_string(index=False, float_format=lambda x: f"{x:.3f}")
        )
        print(
            steps[["step", "us_per_bucket", "ci_lo", "ci_hi"]].to_string(index=False, float_format=lambda x: f"{x:.2f}")
        )
        print(f"[{EXPERIMENT}] wrote {out}/per_bucket.csv and steps.csv")
        return 0

    return command_line(prog, body)


if __name__ == "__main__":
    sys.exit(main())
