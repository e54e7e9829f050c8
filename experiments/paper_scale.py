"""Figures 6-9 at the paper's scale, simulated: a panel of dashed lines labelled "simulated" beside the measured
panels (never mixed into them), on a named cluster of :mod:`simulator.clusters` (``--cluster=NAME`` on the
figure's command line; ``--cluster=`` leaves the panel out).

    python -m experiments.paper_scale [--cluster=paper-v100] [--bandwidth=1.3]   the paper's claims at its scale,
                                        as simulated (--bandwidth scales every link's rate: how much they matter)

The numbers are predictions from stated assumptions (the cluster's sources), not measurements: how far they can
be trusted is the simulator's validation error on this machine (BENCHMARKS.md) and the assumptions themselves.
"""
from __future__ import annotations

import sys

from experiments import common

DEFAULT_CLUSTER = "paper-v100"
BACKENDS = ("nccl", "gloo")
GPUS = {"fig6": 32, "fig7": 16, "fig8": 32}  # the paper's world size per figure
SCALING_GPUS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LABEL = "simulated"


def check(cluster: str) -> None:
    """Refuse an unknown cluster before anything runs ('' is allowed: no simulated panel)."""
    if cluster:
        from simulator.clusters import cluster as named

        named(cluster)


def predict(cluster, model: str, backend: str, gpus: int, bucket_cap_mb: float = 25.0, overlap: bool = True):
    from simulator.clusters import cluster_calibration
    from simulator.predict import Scenario, predict as simulate

    cal = cluster_calibration(cluster, model, backend, gpus)
    return simulate(cal, Scenario(bucket_cap_mb=bucket_cap_mb, overlap=overlap))


def _style(ax, cluster: str) -> None:
    ax.set_title(f"{LABEL}: {cluster}", fontsize=10, color="0.3")
    ax.set_facecolor("#f7f7f7")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def draw_caps(ax, cluster: str, model: str, gpus: int, caps) -> None:
    """Predicted latency vs bucket cap at ``gpus`` GPUs, a dashed line per backend, its best cap circled."""
    caps = sorted(caps)
    for backend in BACKENDS:
        ms = [predict(cluster, model, backend, gpus, cap)["predicted_ms"] for cap in caps]
        line, = ax.plot(range(len(caps)), ms, "--", marker="s", ms=4, label=f"{LABEL}: {backend}, {gpus} GPUs")
        best = min(range(len(caps)), key=ms.__getitem__)
        ax.plot(best, ms[best], "o", ms=10, mfc="none", color=line.get_color())
    ax.set_xticks(range(len(caps)), [common.fmt_mb(c) for c in caps])
    ax.set_xlabel("bucket cap (MiB); circle = best")
    ax.set_ylabel("predicted per-iteration latency (ms)")
    ax.set_ylim(bottom=0)
    _style(ax, f"{cluster}, {model}")


def draw_scaling(ax, cluster: str, model: str, bucket_cap_mb: float) -> None:
    """Predicted latency vs GPUs (log axis) per backend, and the compute-only ideal."""
    for backend in BACKENDS:
        ms = [predict(cluster, model, backend, n, bucket_cap_mb)["predicted_ms"] for n in SCALING_GPUS]
        ax.plot(SCALING_GPUS, ms, "--", marker="s", ms=4, label=f"{LABEL}: DDP, {backend}")
    ideal = predict(cluster, model, BACKENDS[0], 1, bucket_cap_mb)["predicted_ms"]
    ax.axhline(ideal, ls=":", color="k", lw=1, label="ideal: 1 GPU's latency")
    ax.set_xscale("log", base=2)
    ax.set_xticks(SCALING_GPUS, [str(n) for n in SCALING_GPUS])
    ax.set_xlabel("GPUs (8 per server)")
    ax.set_ylabel("predicted per-iteration latency (ms)")
    ax.set_ylim(bottom=0)
    _style(ax, f"{cluster}, {model}")


def draw_overlap(ax, cluster: str, models, gpus: int, bucket_cap_mb: float, colors) -> None:
    """Stacked predicted phases (forward, backward compute, exposed communication, optimizer) per model, backend
    and overlap on/off, hatched as simulated."""
    from simulator.clusters import overlap_speedup

    bars = [(m, b, ov) for m in models for b in BACKENDS for ov in (False, True)]
    parts = ("forward_ms", "backward_compute_ms", "exposed_comm_ms", "optimizer_ms")
    bottom = [0.0] * len(bars)
    preds = [predict(cluster, m, b, gpus, bucket_cap_mb, ov) for m, b, ov in bars]
    for col, color in zip(parts, colors):
        heights = [p[col] for p in preds]
        ax.bar(range(len(bars)), heights, bottom=bottom, color=color, hatch="//", edgecolor="w", width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, (m, b, ov) in enumerate(bars):
        if ov:
            ax.annotate(f"{overlap_speedup(cluster, m, b, gpus, bucket_cap_mb):+.1f}%", (i, bottom[i]),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(bars)), [f"{m}\n{b}\n{'overlap' if ov else 'none'}" for m, b, ov in bars], fontsize=6)
    ax.set_ylabel(f"predicted latency per iteration (ms), {gpus} GPUs")
    ax.set_ylim(0, max(bottom) * 1.25)
    ax.set_title(f"{LABEL}: {cluster}, {gpus} GPUs, {bucket_cap_mb:g} MiB", fontsize=10, color="0.3")
    ax.set_facecolor("#f7f7f7")


def caption(cluster) -> str:
    """The figure's caption sentence for its simulated panel ('' without a cluster)."""
    from simulator.clusters import cluster as named

    if not cluster:
        return ""
    c = named(cluster)
    return (f". Shaded panels are simulated, not measured: {c.name} ({c.description}; {c.device.name} at "
            f"{c.device.sustained_tflops:g} TFLOP/s sustained), paper-profile batches, compute scaled to the "
            "paper's NCCL overlap speedups; numbers and sources in simulator/clusters.py, trust in BENCHMARKS.md "
            "(Simulator)")


def claims_at_scale(cluster=DEFAULT_CLUSTER, models=("resnet50", "bert-base")) -> list[str]:
    """The paper's claims as the simulation answers them at the paper's world sizes (REPRODUCTION.md)."""
    from simulator.clusters import overlap_speedup

    caps = (0, 1, 5, 10, 25, 50, 100, 1000)
    lines = []
    for model in models:
        for backend in BACKENDS:
            gain = overlap_speedup(cluster, model, backend, GPUS["fig6"], 25)
            lines.append(f"fig6 {model}/{backend}, {GPUS['fig6']} GPUs: overlap speedup {gain:+.1f}%")
    for fig in ("fig7", "fig8"):
        for model in models:
            for backend in BACKENDS:
                ms = {c: predict(cluster, model, backend, GPUS[fig], c)["predicted_ms"] for c in caps}
                best, worst = min(ms, key=ms.get), max(ms, key=ms.get)
                lines.append(f"{fig} {model}/{backend}, {GPUS[fig]} GPUs: best cap {common.fmt_mb(best)} MiB "
                             f"({ms[best]:.0f} ms), worst {common.fmt_mb(worst)} MiB ({ms[worst]:.0f} ms), best vs "
                             f"worst {ms[worst] / ms[best]:.2f}x; 25 MiB is {ms[25] / ms[best]:.2f}x the best")
    for model in models:
        for backend in BACKENDS:
            ms = {n: predict(cluster, model, backend, n)["predicted_ms"] for n in SCALING_GPUS}
            lines.append(f"fig9 {model}/{backend}: " + ", ".join(f"{n}: {v:.0f}" for n, v in ms.items())
                         + f" ms; weak-scaling efficiency at 256 GPUs {100 * ms[1] / ms[256]:.0f}%")
    return lines


def main(argv=None) -> int:
    from harness.config import OneLineParser
    from harness.errors import command_line, refusing

    def body() -> int:
        parser = OneLineParser(prog="python -m experiments.paper_scale", description=__doc__.split("\n\n")[0])
        parser.add_argument("--cluster", default=DEFAULT_CLUSTER)
        parser.add_argument("--bandwidth", type=float, default=1.0, help="every link's bandwidth times this")
        ns = parser.parse_args(argv)
        with refusing():
            from simulator.clusters import cluster

            chosen = cluster(ns.cluster).with_bandwidth(ns.bandwidth)
        print("\n".join(claims_at_scale(chosen)))
        return 0

    return command_line("python -m experiments.paper_scale", body)


if __name__ == "__main__":
    sys.exit(main())
