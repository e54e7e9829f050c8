"""One rank's probe, run by :func:`simulator.probe.calibrate.calibrate` on a point's own ranks and network (as a
``harness.run_point`` fn): compute, the link, calls inside backward, compute under communication and the memory-copy
rate, each measured where DDP pays it. What each measurement is for: ``simulator/probe/calibrate.py``."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ddp_impl.options import MIB
from ddp_impl.reducer import hook_accumulators
from harness import AllreduceConfig, TrainConfig
from harness.workloads.collectives import run_allreduce_point
from harness.workloads.models import compute_loss, input_spec, make_inputs, seeded_model
from harness.workloads.phases import ms, now, stamp, timed_ms
from harness.workloads.runner import build_trainer, timed_iteration

from ..model.comm import AlphaBeta, fit_link
from . import stand_in

PROBE_SIZES = (4 * 1024, 64 * 1024, MIB, 8 * MIB, 32 * MIB, 128 * MIB)  # bytes per allreduce call, up to ...
# ... at least the first three: a line through two latency-bound sizes left the cost per byte to noise (tiny-layers'
# 0.4 MiB gradient on loopback: 0 in most probes, 0.14 Gbit/s in one, r2 0.40)
MIN_PROBE_SIZES = 3
# backward passes with one allreduce per gradient (after one that warms them up): with 3, the per-call latency fitted
# to their median moved 1.07-1.75 ms between probes of tiny-layers' 800 gradients on 2 cores; with 9, 1.14-1.20 ms
LATENCY_ITERS = 9
CONTENTION_PAIRS = 7  # (backward alone, backward under an allreduce) pairs; their compute halves join compute's
PROBE_CALLS = 3  # timed calls per size, after one warm-up call (2 for calls of 32 MiB and more)
MAX_COVER_BYTES = 512 * MIB  # the contention probe's allreduce never allocates more
STORED_LINK_LARGEST = 64 * MIB  # stored calls stand in for the probe's if their largest is min(gradient, this): an
#                                 emulated link's burst passes small calls fast, so the rate must come from large ones
COPY_REPEATS, COPY_WARMUP = 3, 1  # timed gradient copies, after the first (which faults the copy's pages in)
DDP_PHASES = ("forward_ms", "backward_ms", "optimizer_ms", "total_ms")
PHASES = ("forward", "backward", "optimizer")


def median(values) -> float:
    return float(statistics.median(values))


@dataclass
class _CallStream:
    """During a latency-probe backward: the allreduce launched for each gradient as it became ready, and when each
    completed (stamped by the communication thread)."""

    works: list
    done: list = field(default_factory=list)


class RankProbe:
    """What every measurement of one rank's probe shares: the model without DDP and its optimizer, each gradient's
    ready time (stamped by ddp_impl's own hook on its gradient accumulator, the signal DDP's buckets follow), and
    DDP at the point's settings on a second replica, so that compute is timed right after DDP's iterations."""

    def __init__(self, ctx, cfg: TrainConfig):
        self.ctx, self.cfg = ctx, cfg
        self.model = seeded_model(cfg.model, cfg.seed).to(ctx.device)
        self.inputs = make_inputs(
            cfg.model, input_spec(cfg.model, cfg.profile, cfg.batch_size), ctx.device, seed=cfg.seed * 1000 + ctx.rank
        )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.ready_at = [math.nan] * len(self.params)
        self.grad_buffers = [torch.zeros_like(p) for p in self.params]  # what the latency probe reduces
        self.stream: _CallStream | None = None
        self.accumulators, _ = hook_accumulators(self.params, lambda i: lambda *_: self._on_ready(i))  # held here
        self.optimizer = torch.optim.SGD(self.params, lr=cfg.lr)
        self.trainer = None  # DDP's replica, built by the first after_ddp()
        self.ddp_runs: list[dict] = []  # DDP's own phases, for the record

    @property
    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)

    def _on_ready(self, i: int) -> None:
        self.ready_at[i] = now()
        if self.stream is not None:  # DDP's calls at cap 0: one allreduce of each gradient's size, as it is ready
            work = dist.all_reduce(self.grad_buffers[i], group=self.ctx.group, async_op=True)
            done = self.stream.done
            work.get_future().add_done_callback(lambda _f: done.append(now()))
            self.stream.works.append(work)

    def iteration(self, cover: torch.Tensor | None = None, calls: bool = False) -> dict:
        """One iteration without DDP (ms): its phases and each gradient's ready time from backward's start; with
        ``cover``, under one allreduce of it launched as backward starts; with ``calls``, one allreduce per gradient."""
        ctx = self.ctx
        dist.barrier(group=ctx.group)
        t0 = now()
        loss = compute_loss(self.cfg.model, self.model, self.inputs)
        t1 = stamp(ctx)
        works = [] if cover is None else [dist.all_reduce(cover, group=ctx.group, async_op=True)]
        if calls:
            self.stream = _CallStream(works)
        loss.backward()
        t2 = stamp(ctx)
        done = self.stream.done if self.stream is not None else []
        self.stream = None
        for work in works:
            work.wait()
        covered = now()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        t3 = stamp(ctx)
        return dict(
            forward=ms(t0, t1),
            backward=ms(t1, t2),
            optimizer=ms(covered, t3),
            ready=[ms(t1, s) for s in self.ready_at],
            covered=ms(t1, covered),
            calls_done=ms(t1, max(done, default=t1)),
        )

    def after_ddp(self) -> dict:
        """A compute-only iteration right after one of DDP at the point's settings (whose phases are kept), at one
        rank too: there compute timed back to back read 14-20% faster than beside DDP's iterations (tiny-layers)."""
        if self.trainer is None:
            self.trainer = build_trainer(
                seeded_model(self.cfg.model, self.cfg.seed).to(self.ctx.device), self.cfg, self.ctx
            )
        self.ddp_runs.append(
            timed_iteration(self.cfg.model, self.trainer.model, self.trainer.optimizer, self.inputs, self.ctx)[0]
        )
        return self.iteration()

    def measured(self, step) -> list[dict]:
        """``step()`` for the point's warm-up and measured iterations; the measured ones."""
        return [step() for _ in range(self.cfg.warmup + self.cfg.iters)][self.cfg.warmup :]


def probe_rank(ctx, cfg: TrainConfig, full: bool = True, link: tuple = ()) -> list[dict]:
    """One rank's probe (a ``run_point`` fn): compute, then the link (the given ``link`` samples instead, from
    :func:`simulator.probe.calibrate.stored_link`, where its calls reach the sizes the probe's would), then calls inside
    backward, then compute under communication; with ``full=False`` (:func:`compute_rank`) only the compute after
    DDP's iterations."""
    probe = RankProbe(ctx, cfg)
    before_ddp = probe.measured(probe.iteration) if full else []  # compute before any DDP iteration, for the record
    runs = probe.measured(probe.after_ddp)
    found = dict(
        comm_samples=[],
        link="probed",
        calls_done_ms=[],
        calls_backward_ms=[],
        contention_pairs=[],
        comm_contention=0.0,
        host_cost={},
    )
    copy_ms_per_byte = _copy_ms_per_byte(probe)
    if full:  # a refresh (compute_rank) re-times only the compute above
        found.update(_link_samples(probe, link))
        if ctx.world_size > 1:
            comm = fit_link(found["comm_samples"]).model
            found["calls_done_ms"], found["calls_backward_ms"] = _calls_in_backward(probe)  # per pass
            pairs, found["comm_contention"] = _contention(probe, comm, runs)
            found["contention_pairs"] = [(alone["backward"], under["backward"]) for alone, under in pairs]
            # The compute-only halves join the first iterations: a host's speed moves within minutes, and one slow
            # spell at the probe's start would otherwise set the compute of every prediction (most visibly where
            # no_sync leaves little else).
            runs += [alone for alone, _ in pairs]
        # one rank too: there DDP's host work is all it adds (an H100 ran torch's DDP 1.19-1.39x no DDP)
        found["host_cost"] = stand_in.measure(ctx, cfg, copy_ms_per_byte, probe.params)
    # DDP's first iteration runs on the first bucket layout, the second rebuilds it in its forward (none may be left
    # at one rank with few iterations: there no contention pairs add more)
    settled = probe.ddp_runs[max(2, cfg.warmup) :]
    # every iteration's phases and ready times, not medians: DDP waits for the slower rank in each iteration
    # (calibrate.slowest_compute), which takes longer than the slower rank's median on a shared host
    return [
        dict(
            rank=ctx.rank,
            backend=ctx.backend,
            runs=[{k: r[k] for k in (*PHASES, "ready")} for r in runs],
            param_bytes=[p.numel() * p.element_size() for p in probe.params],
            **found,
            copy_ms_per_byte=copy_ms_per_byte,
            buffer_bytes=sum(b.numel() * b.element_size() for b in probe.model.buffers()),
            ddp={k: median(r[k] for r in settled) for k in DDP_PHASES} if settled else {},
            compute_before_ddp={f"{k}_ms": median(r[k] for r in before_ddp) for k in PHASES} if before_ddp else {},
        )
    ]


def compute_rank(ctx, cfg: TrainConfig) -> list[dict]:
    """A refresh's probe (a ``run_point`` fn): only what drifts, compute timed right after DDP's iterations."""
    return probe_rank(ctx, cfg, full=False)


def _link_samples(probe: RankProbe, link: tuple) -> dict:
    """The link's (ranks, bytes, ms) calls: ``link`` (make fig2's, stored) where its largest call reaches what DDP
    sends, else fig2's microbenchmark here, one call of each size per iteration after one warm-up call, up to the
    largest bucket DDP could send."""
    ctx = probe.ctx
    if max((n for _, n, _ in link), default=0) >= min(probe.grad_bytes, STORED_LINK_LARGEST):
        return dict(comm_samples=list(link), link="stored")
    samples = []
    for nbytes in PROBE_SIZES[: max(MIN_PROBE_SIZES, sum(n < 2 * probe.grad_bytes for n in PROBE_SIZES))]:
        n = nbytes // 4
        calls = AllreduceConfig(
            backend=ctx.backend,
            world_size=ctx.world_size,
            total_params=n,
            params_per_call=n,
            iters=PROBE_CALLS if nbytes < 32 * MIB else 2,
            warmup=1,
        )
        samples += [(ctx.world_size, r["total_bytes"], r["call_ms"]) for r in run_allreduce_point(ctx, calls)]
    return dict(comm_samples=samples, link="probed")


def _calls_in_backward(probe: RankProbe) -> tuple[list[float], list[float]]:
    """When the last of one allreduce per gradient, each launched as its gradient became ready, completed (ms from
    backward's start), and when backward's compute ended beside those calls (per pass). What a call
    costs where DDP pays it: inside backward, carrying the gradient's bytes, while the ranks' compute threads hold
    the cores. Small calls alone (between barriers, back to back, or inside backward) cost per call a factor 2-5
    apart between rank counts and runs on 2 cores, and several times what a call costs DDP while bytes flow. The
    first pass warms up. Each completion is stamped by a Python callback, which takes the interpreter's lock on the
    communication thread and about doubles what a tiny call costs after backward (0.5-0.75 -> 1.0-1.9 ms); counted
    without it, and with the calls grouped as DDP's buckets, 80 buckets read 10-12% low on one machine. Grouped with
    the callbacks, they met tiny-layers at 2 ranks on another but priced ResNet50's cap 0 12% low: its grouped calls
    are bound by their bytes, so alpha came out 0 (BENCHMARKS.md, hostval)."""
    streams = [probe.iteration(calls=True) for _ in range(1 + LATENCY_ITERS)][1:]
    return [r["calls_done"] for r in streams], [r["backward"] for r in streams]


def _contention(probe: RankProbe, comm: AlphaBeta, runs: list[dict]) -> tuple[list, float]:
    """Backward alone (right after DDP's iteration) and under one allreduce 1.5x as long as ``runs``' backward, in
    pairs, so that drift between the probe's phases (this host's speed moves within minutes) cancels; and what the
    compute costs the allreduce's bytes (``comm_contention``)."""
    ctx = probe.ctx
    steps = 2 * (ctx.world_size - 1)
    per_byte = steps / ctx.world_size * comm.beta_ms_per_byte
    want = (1.5 * median(r["backward"] for r in runs) - steps * comm.alpha_ms) / max(per_byte, 1e-12)
    size = torch.tensor([min(MAX_COVER_BYTES, max(32 * MIB, want))], dtype=torch.float64)
    dist.all_reduce(size, op=dist.ReduceOp.MAX, group=ctx.group)
    cover = torch.zeros(int(size.item()) // 4, dtype=torch.float32, device=ctx.device)
    pairs = [(probe.after_ddp(), probe.iteration(cover)) for _ in range(CONTENTION_PAIRS)]
    # The allreduce ran over the whole backward; the time it took beyond its cost alone is what its bytes lost
    # while compute ran: a share x of the backward means they moved at rate 1 - x there.
    alone_ms = comm.allreduce_ms(cover.numel() * 4, ctx.world_size)
    lost = min(max(median((r["covered"] - alone_ms) / r["backward"] for _, r in pairs), 0.0), 0.9)
    return pairs, lost / (1 - lost)


def _copy_ms_per_byte(probe: RankProbe) -> float:
    """The rank's memory-copy rate: DDP copies each gradient into its bucket and back out."""
    grads = torch.cat([p.detach().reshape(-1) for p in probe.params])
    copy = torch.empty_like(grads)
    times = timed_ms(probe.ctx, lambda: copy.copy_(grads), repeats=COPY_REPEATS, warmup=COPY_WARMUP)
    return median(times) / (grads.numel() * grads.itemsize)
