"""Figure 2: allreduce time vs parameters per call, beside backward compute time (paper Section 3.2).

    make fig2                                   CPU default: Gloo, 2 ranks, ResNet50-sized gradient (~4 min)
    make fig2 ARGS="--world_sizes=2,4 --params_per_call=100000,1000000"
    torchrun ... -m experiments fig2 --world_sizes=16 --total_params=60000000

A flat float32 gradient of ``total_params`` (default: ResNet50's 25,557,032, the default ``compute_model``'s count)
is allreduced in calls of k parameters each. Fewer, larger calls should be much faster; and the total time should be
of the same order as the model's backward pass (measured on one rank without DDP), which is why overlapping the two
pays. The dashed line in each panel is that backward compute time; with ``net=auto`` the dotted line is the backward
(all ranks computing at once) that set the emulated link's rate, at which one allreduce of the whole gradient takes
exactly that long. The thin dash-dotted lines are the ring alpha-beta model fitted to the measured calls
(:func:`ring_fits`, the simulator's cost model; its fit is printed by the summary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from experiments import common, plotting, verdicts
from harness import AllreduceConfig, TrainConfig
from harness.workloads.collectives import BYTES_PER_PARAM, call_samples

FIGURE = "fig2"
PAPER = {
    "setup": "60M float32 parameters, NCCL and Gloo, 2-16 GPUs [likely]; backward of ResNet152 [likely]",
    "claim": "fewer, larger allreduces are much faster; backward compute and communication take similar time",
}
RESNET50_PARAMS = 25_557_032


@dataclass(frozen=True)
class Config(common.Timed):
    """Allreduce granularity sweep; every field is a --key=value override."""

    world_sizes: tuple[int, ...] = (2,)  # ranks: a curve per world size and backend
    # k: parameters per allreduce call, a point each (a k above total_params is one call of them all)
    params_per_call: tuple[int, ...] = (10_000, 100_000, 1_000_000, 10_000_000, RESNET50_PARAMS)
    total_params: int = RESNET50_PARAMS  # float32 parameters allreduced per iteration (as many as ResNet50's)
    compute_model: str = "resnet50"  # model whose backward (1 rank, no DDP) is drawn beside the calls
    iters: int = 5
    warmup: int = 1


def points(cfg: Config) -> list:
    # a call larger than every parameter is one call of all of them (--total_params below the defaults' largest)
    calls = sorted({min(k, cfg.total_params) for k in cfg.params_per_call})
    out = []
    for n in cfg.world_sizes:
        backends, _ = common.split_backends(cfg.backends, n)
        out += [
            AllreduceConfig(
                backend=b,
                world_size=n,
                profile=cfg.profile,
                total_params=cfg.total_params,
                params_per_call=k,
                iters=cfg.iters,
                warmup=cfg.warmup,
                net=cfg.net,
                hosts=cfg.hosts,
                repeat=r,
            )
            for r in range(cfg.repeats)
            for b in backends
            for k in calls
        ]
    # backward compute of the model alone: one rank, no DDP; on the GPU when there is one
    out += [
        TrainConfig(
            model=cfg.compute_model,
            impl="local",
            world_size=1,
            profile=cfg.profile,
            iters=cfg.iters,
            warmup=cfg.warmup,
            repeat=r,
        )
        for r in range(cfg.repeats)
    ]
    return out


def _split(df, cfg: Config):
    ok = common.ok_rows(df, synced_only=False)
    comm = common.for_net(
        ok[(ok["point_type"] == "AllreduceConfig") & (ok["total_params"] == cfg.total_params)], cfg.net, cfg.hosts
    )
    compute = ok[(ok["point_type"] == "TrainConfig") & (ok["model"] == cfg.compute_model)]
    return comm, compute


def ring_fits(comm) -> dict:
    """Per backend, the ring alpha-beta model (``simulator.model.comm.fit_ring``) fitted to every (world size, call
    size) median cost per call: the per-step latency and the link bandwidth the sequential calls of this figure
    imply."""
    from simulator.model.comm import fit_ring

    fits = {}
    for backend, sel in comm.groupby("backend"):
        samples = call_samples(sel)
        if len({nbytes for _, nbytes, _ in samples}) >= 2:
            fits[backend] = fit_ring(samples)
    return fits


def plot(df, cfg: Config):
    comm, compute = _split(df, cfg)
    unavailable = common.missing_backends(comm, cfg.backends, max(cfg.world_sizes))
    backends = plotting.shown_backends(cfg.backends, unavailable)
    fig, axes = plotting.grid([""], backends, width=9.5)  # the legend beside the panel: the curve spans its width
    fits = ring_fits(comm)
    for c, backend in enumerate(backends):
        ax = axes[0][c]
        sel = comm[comm["backend"] == backend]
        if sel.empty:
            plotting.mark_unavailable(ax, unavailable.get(backend, f"no results for {backend}"))
            continue
        plotting.median_lines(ax, sel, "params_per_call", "total_ms", "world_size", label=lambda n: f"{n} ranks")
        plotting.repeat_markers(ax, sel, ["world_size", "params_per_call"], "params_per_call")
        if backend in fits:
            _ring_fit_lines(ax, sel, fits[backend].model, cfg)
        _backward_lines(ax, sel, compute, backend, cfg)
        _axes(ax, sel, backend, cfg)
    return plotting.finish(
        fig,
        "Figure 2: communication granularity vs backward computation",
        PAPER["claim"],
        comm,
        unavailable=unavailable,
    )


def _ring_fit_lines(ax, sel, model, cfg: Config) -> None:
    """The fitted ring model's total time for the same calls as measured, a line per world size above 1."""
    ks = sorted(sel["params_per_call"].unique())
    calls = [math.ceil(cfg.total_params / k) for k in ks]
    nbytes = cfg.total_params * BYTES_PER_PARAM
    for i, n in enumerate(sorted(w for w in sel["world_size"].unique() if w > 1)):
        ax.plot(
            ks,
            [c * model.allreduce_ms(nbytes / c, n) for c in calls],
            "-.",
            lw=1,
            color="C2",
            label=None if i else f"ring fit: {model.alpha_ms * 1e3:.0f} us/step, {model.busbw_gbit:.2f} Gbit/s",
        )


def _backward_lines(ax, sel, compute, backend: str, cfg: Config) -> None:
    """The backward pass the calls compare with: the compute model's on this backend's device (dashed), and with
    ``net=auto`` the backward of all ranks at once that set the link's rate (dotted)."""
    device = "GPU" if backend == "nccl" else "CPU"
    on_device = compute[compute["device_name"].ne("cpu") == (backend == "nccl")]
    if not on_device.empty:  # the number the summary prints: the median of the repetitions' medians
        bwd = verdicts.spread(
            verdicts.repeat_medians(on_device, ["model"], "backward_compute_ms").xs(cfg.compute_model)
        )
        ax.axhline(
            bwd.center, ls="--", color="k", label=f"{cfg.compute_model} backward on {device} ({bwd.center:.0f} ms)"
        )
    if "net_auto_backward_ms" in sel:  # net=auto: the backward (all ranks at once) the link rate was set from
        for n, part in sel.dropna(subset=["net_auto_backward_ms"]).groupby("world_size"):
            ms, rate = part["net_auto_backward_ms"].median(), part["net_rate_mbit"].median()
            ax.axhline(
                ms,
                ls=":",
                color="0.4",
                label=f"backward on {n} ranks that set the link ({ms:.0f} ms -> {rate:.0f} Mbit/s)",
            )


def _axes(ax, sel, backend: str, cfg: Config) -> None:
    """Log axes ticked at the measured call sizes, title, labels, and the legend beside the panel."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ks = sorted(sel["params_per_call"].unique())
    ax.set_xticks(ks, [_count(k) for k in ks])  # the measured call sizes, in the units of the title
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_title(f"{backend}: allreduce {_count(cfg.total_params)} float32 parameters", fontsize=10)
    ax.set_xlabel("parameters per allreduce call")
    ax.set_ylabel("total time (ms)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))


def _count(k: float) -> str:
    """A number of parameters as the ticks and title write it: 10k, 1M, 25.6M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if k >= size:
            return f"{k / size:.3g}{suffix}"
    return f"{k:g}"


def summarize(df, cfg: Config) -> str:
    """Smallest vs largest calls per backend and world size, each with its spread over repetitions; their ratio
    is taken repetition by repetition."""
    comm, compute = _split(df, cfg)
    lines = []
    for (backend, n), sel in comm.groupby(["backend", "world_size"]):
        per_repeat = verdicts.repeat_medians(sel, ["params_per_call"])
        small, large = per_repeat.index.get_level_values(0).min(), per_repeat.index.get_level_values(0).max()
        ratio = verdicts.paired_ratios(per_repeat, small, large)
        bus = sel.groupby("params_per_call")["busbw_gbps"].median()
        lines.append(
            f"{backend}, {n} ranks: {verdicts.spread(per_repeat.xs(small)).fmt()} in calls of {small:,} "
            f"params vs {verdicts.spread(per_repeat.xs(large)).fmt()} in calls of {large:,} "
            f"({verdicts.spread(ratio).fmt('x', 1)}); busbw {bus[small]:.2f} -> {bus[large]:.2f} GB/s"
        )
    for backend, fit in ring_fits(comm).items():
        lines.append(
            f"{backend} ring alpha-beta fit (simulator.model.comm): alpha {fit.model.alpha_ms * 1e3:.0f} us "
            f"per step, {fit.model.busbw_gbit:.2f} Gbit/s per link; R^2 {fit.r2:.3f}, error median "
            f"{fit.median_abs_pct_error:.0f}% / worst {fit.worst_abs_pct_error:.0f}% over {fit.n} "
            "(ranks, call size) medians"
        )
    if not compute.empty:
        bwd = verdicts.repeat_medians(compute, ["model"], "backward_compute_ms").xs(cfg.compute_model)
        lines.append(f"{cfg.compute_model} backward compute (1 rank): {verdicts.spread(bwd).fmt()}")
    return "\n".join(lines) or "no results"
