"""The link rate a point's ranks get: none (loopback), the rate it names, or ``auto``'s, measured here.

``auto`` is the rate at which one ring allreduce of the model's whole gradient takes as long as its backward
(the regime of the paper's Figure 2): the backward is timed on as many ranks as the point's, computing at once
without DDP, and cached per (model, profile, batch, threads, ranks) for the sweep process. The rate is applied by
:class:`harness.netem.shaping.NamespacePool`; a sweep times it on that pool's own ranks before it shapes their link
(``harness.sweep``), which saves a launch, its imports and a build of the model (BERT-base: ~15 s).
"""

from __future__ import annotations

import math

from harness.launch.env import ranks_on_this_node, threads_per_rank
from harness.launch.spawn import launch
from harness.netem.rate import parse_rate
from harness.workloads.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.workloads.phases import ms, stamp

AUTO_MODEL = "resnet50"  # auto's reference model for points without a model (allreduce microbenchmark)
AUTO_WARMUP, AUTO_ITERS = 1, 3  # backward passes timed by auto: median of AUTO_ITERS after AUTO_WARMUP

_backward_cache: dict[tuple, dict] = {}  # (model, profile, batch, threads, ranks) -> {backward_ms, grad_bytes}


def _time_backward(ctx, model_name: str, profile: str, batch_size: int) -> dict:
    """One rank's backward times of ``model_name`` without DDP, and its gradient bytes (a launch fn)."""
    model = seeded_model(model_name, 0).to(ctx.device)
    inputs = make_inputs(model_name, input_spec(model_name, profile, batch_size), ctx.device)
    times = []
    for it in range(AUTO_WARMUP + AUTO_ITERS):
        loss = compute_loss(model_name, model, inputs)
        t0 = stamp(ctx)
        loss.backward()
        times.append(ms(t0, stamp(ctx)))
        model.zero_grad(set_to_none=True)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"times_ms": times[AUTO_WARMUP:], "grad_bytes": grad_bytes}


def measure_backward(model: str, profile: str, batch_size: int, threads: int, ranks: int, run=None) -> dict:
    """``{backward_ms, grad_bytes}``: median backward of ``model`` over ``ranks`` ranks computing at once (no DDP,
    no communication) with ``threads`` threads each, so the cores are shared as in the run: ranks spawned for it,
    or ``run(fn, args)``'s (a pool's ``run``, its ranks as the key says)."""
    key = (model, profile, batch_size, threads, ranks)
    if key not in _backward_cache:
        args = (model, profile, batch_size)
        per_rank = (
            run(_time_backward, args)
            if run
            else launch(_time_backward, ranks, "gloo", args=args, threads=threads, timeout_s=600)
        )
        times = sorted(t for r in per_rank for t in r["times_ms"])
        _backward_cache[key] = {"backward_ms": times[len(times) // 2], "grad_bytes": per_rank[0]["grad_bytes"]}
    return _backward_cache[key]


def auto_rate(cfg, run=None) -> tuple[float, float]:
    """``(rate_mbit, backward_ms)`` for a resolved point with ``net='auto'``.

    rate = bus bytes / backward time, bus bytes = 2(n-1)/n x gradient bytes, so the ring allreduce of the
    whole gradient at busbw = rate takes one backward. The backward is timed without DDP on as many ranks
    as the point runs on this machine, all computing at once with the point's threads per rank, because ranks
    that share cores and memory bandwidth compute more slowly than one rank alone (on a loaded 2-core machine,
    2 ranks took about twice as long). Points without a ``model`` (allreduce microbenchmark) use ResNet50
    (``AUTO_MODEL``): Figure 2's ResNet50-sized allreduce then also takes about one backward. ``run``: as
    :func:`measure_backward`'s.
    """
    model = getattr(cfg, "model", AUTO_MODEL)
    ranks = ranks_on_this_node(cfg.world_size)
    threads = threads_per_rank(ranks, cfg.threads_per_rank)
    m = measure_backward(model, cfg.profile, getattr(cfg, "batch_size", 0), threads, ranks, run)
    bus_bytes = 2 * (cfg.world_size - 1) / cfg.world_size * m["grad_bytes"]
    return bus_bytes * 8 / 1e6 / (m["backward_ms"] / 1e3), m["backward_ms"]


def point_rate(cfg, run=None) -> tuple[float | None, float]:
    """``(rate_mbit or None for loopback, auto's backward_ms or NaN)`` for a resolved point config (``run``: as
    :func:`measure_backward`'s)."""
    if cfg.net == "loopback":
        return None, math.nan
    if cfg.net == "auto":
        return auto_rate(cfg, run)
    return parse_rate(cfg.net), math.nan
