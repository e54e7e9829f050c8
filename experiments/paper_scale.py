"""Figures 6-9 at the paper's scale, simulated: a panel of dashed lines labelled "simulated" beside the measured
panels (never mixed into them), on a named cluster of :mod:`simulator.model.clusters` (``--cluster=NAME`` on the
figure's command line; ``--cluster=`` leaves the panel out).

    python -m experiments paper-scale [--cluster=paper-v100] [--bandwidth=1.3]   the paper's claims at its scale,
                                        as simulated (--bandwidth scales every link's rate: how much they matter)

The numbers are predictions from measurements made elsewhere (the cluster's sources), each with a stated range that
the bands span; nothing is fitted to the paper, whose numbers are checks (REPRODUCTION.md, "At the paper's scale").
"""

from __future__ import annotations

import sys

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common

DEFAULT_CLUSTER = "paper-v100"
BACKENDS = ("nccl", "gloo")
GPUS = {"fig6": 32, "fig7": 16, "fig8": 32}  # the paper's world size per figure
SCALING_GPUS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LABEL = "simulated"


def check(cluster: str) -> None:
    """Refuse an unknown cluster before anything runs ('' is allowed: no simulated panel)."""
    if cluster:
        from simulator.model.clusters import cluster as named

        named(cluster)


def predict(
    cluster,
    model: str,
    backend: str,
    gpus: int,
    bucket_cap_mb: float = float(DEFAULT_BUCKET_CAP_MB),
    overlap: bool = True,
    at=None,
    batch: int | None = None,
):
    from simulator.model.clusters import MIDDLE, cluster_calibration
    from simulator.model.scenario import Scenario
    from simulator.model.scenario import predict as simulate
    from simulator.probe.flops import count_flops

    cal = cluster_calibration(cluster, model, backend, gpus, batch, at or MIDDLE, count_flops)
    return simulate(cal, Scenario(bucket_cap_mb=bucket_cap_mb, overlap=overlap))


def predicted_band(
    cluster,
    model: str,
    backend: str,
    gpus: int,
    bucket_cap_mb: float = float(DEFAULT_BUCKET_CAP_MB),
    overlap: bool = True,
    batch: int | None = None,
) -> tuple[float, float, float]:
    """(lowest, middle, highest) predicted latency over the assumptions' ranges (simulator.model.clusters.band)."""
    from simulator.model.clusters import band

    return band(lambda at: predict(cluster, model, backend, gpus, bucket_cap_mb, overlap, at, batch)["predicted_ms"])


def _style(ax, cluster: str) -> None:
    ax.set_title(f"{LABEL}: {cluster}", fontsize=10, color="0.3")
    ax.set_facecolor("#f7f7f7")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _line_with_band(ax, x, bands, label: str):
    lo, mid, hi = zip(*bands)
    (line,) = ax.plot(x, mid, "--", marker="s", ms=4, label=f"{label} (band: assumptions' ranges)")
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, lw=0)
    return line, list(mid)


def draw_caps(ax, cluster: str, model: str, gpus: int, caps) -> None:
    """Predicted latency vs bucket cap at ``gpus`` GPUs, a dashed line and its band per backend, its best cap
    circled."""
    caps = sorted(caps)
    for backend in BACKENDS:
        bands = [predicted_band(cluster, model, backend, gpus, cap) for cap in caps]
        line, ms = _line_with_band(ax, range(len(caps)), bands, f"{LABEL}: {backend}, {gpus} GPUs")
        best = min(range(len(caps)), key=ms.__getitem__)
        ax.plot(best, ms[best], "o", ms=10, mfc="none", color=line.get_color())
    ax.set_xticks(range(len(caps)), [common.fmt_mb(c) for c in caps])
    ax.set_xlabel("bucket cap (MiB); circle = best")
    ax.set_ylabel("predicted per-iteration latency (ms)")
    ax.set_ylim(bottom=0)
    _style(ax, f"{cluster}, {model}")


def draw_scaling(ax, cluster: str, model: str, bucket_cap_mb: float) -> None:
    """Predicted latency vs GPUs (log axis) per backend with its band, and the compute-only ideal."""
    for backend in BACKENDS:
        _line_with_band(
            ax,
            SCALING_GPUS,
            [predicted_band(cluster, model, backend, n, bucket_cap_mb) for n in SCALING_GPUS],
            f"{LABEL}: DDP, {backend}",
        )
    ideal = predict(cluster, model, BACKENDS[0], 1, bucket_cap_mb)["predicted_ms"]
    ax.axhline(ideal, ls=":", color="k", lw=1, label="ideal: 1 GPU's latency")
    ax.set_xscale("log", base=2)
    ax.set_xticks(SCALING_GPUS, [str(n) for n in SCALING_GPUS])
    ax.set_xlabel("GPUs (8 per server)")
    ax.set_ylabel("predicted per-iteration latency (ms)")
    ax.set_ylim(bottom=0)
    _style(ax, f"{cluster}, {model}")


def draw_overlap(ax, cluster: str, models, gpus: int, bucket_cap_mb: float, colors) -> None:
    """Stacked predicted phases (forward, backward compute, DDP's host work and exposed communication, optimizer) per
    model, backend and overlap on/off, hatched as simulated; a whisker spans each total's band, and the overlap
    speedup is labelled with its range."""
    from simulator.model.clusters import band, overlap_speedup
    from simulator.probe.flops import count_flops

    bars = [(m, b, ov) for m in models for b in BACKENDS for ov in (False, True)]
    parts = ("forward_ms", "backward_compute_ms", "exposed_comm_ms", "optimizer_ms")
    bottom = [0.0] * len(bars)
    preds = [predict(cluster, m, b, gpus, bucket_cap_mb, ov) for m, b, ov in bars]
    for col, color in zip(parts, colors):
        heights = [p[col] for p in preds]
        ax.bar(range(len(bars)), heights, bottom=bottom, color=color, hatch="//", edgecolor="w", width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights)]
    totals = [predicted_band(cluster, m, b, gpus, bucket_cap_mb, ov) for m, b, ov in bars]
    ax.errorbar(
        range(len(bars)),
        bottom,
        yerr=[[t - lo for t, (lo, _, _) in zip(bottom, totals)], [hi - t for t, (_, _, hi) in zip(bottom, totals)]],
        fmt="none",
        ecolor="0.25",
        capsize=3,
        lw=1,
    )
    for i, (m, b, ov) in enumerate(bars):
        if ov:
            lo, mid, hi = band(lambda at: overlap_speedup(cluster, m, b, gpus, bucket_cap_mb, at, count_flops))
            ax.annotate(f"{mid:+.0f}%\n[{lo:+.0f}, {hi:+.0f}]", (i, totals[i][2]), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(bars)), [f"{m}\n{b}\n{'overlap' if ov else 'none'}" for m, b, ov in bars], fontsize=6)
    ax.set_ylabel(f"predicted latency per iteration (ms), {gpus} GPUs")
    ax.set_ylim(0, max(hi for _, _, hi in totals) * 1.3)
    ax.set_title(f"{LABEL}: {cluster}, {gpus} GPUs, {bucket_cap_mb:g} MiB", fontsize=10, color="0.3")
    ax.set_facecolor("#f7f7f7")


def caption(cluster) -> str:
    """The figure's caption sentence for its simulated panel ('' without a cluster). At length: the shaded panels are
    simulated, not measured, on the named cluster (its description and device in ``simulator.model.clusters``), at
    paper-profile batches, with compute from published single-GPU measurements and nothing fitted to the paper;
    bands and whiskers span each assumption's stated range; numbers and sources in simulator/model/cluster_data.py,
    checks in REPRODUCTION.md."""
    from simulator.model.clusters import cluster as named

    if not cluster:
        return ""
    return f". Shaded panels: simulated on {named(cluster).name} (simulator/model/cluster_data.py)"


CAPS = (0, 1, 5, 10, 25, 50, 100, 1000)


def _fmt(b, unit: str = "", digits: int = 0) -> str:
    lo, mid, hi = b
    return f"{mid:.{digits}f}{unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


def claims_at_scale(cluster=DEFAULT_CLUSTER, models=("resnet50", "bert-base")) -> list[tuple[str, str, str]]:
    """The paper's claims as the simulation answers them at the paper's world sizes: (claim, simulated with its band,
    the paper's) per row (REPRODUCTION.md adds the agreement)."""
    from simulator.model.cluster_data import PAPER_OVERLAP_SPEEDUP
    from simulator.model.clusters import band, overlap_speedup
    from simulator.probe.flops import count_flops

    rows = []
    for model in models:
        for backend in BACKENDS:
            gain = band(
                lambda at: overlap_speedup(
                    cluster, model, backend, GPUS["fig6"], DEFAULT_BUCKET_CAP_MB, at, count_flops
                )
            )
            rows.append(
                (
                    f"fig6 overlap speedup, {model}/{backend}, {GPUS['fig6']} GPUs",
                    _fmt(gain, "%", 1),
                    f"{PAPER_OVERLAP_SPEEDUP[model, backend]:.1f}%",
                )
            )
    for fig in ("fig7", "fig8"):
        for model in models:
            for backend in BACKENDS:
                ms = {c: predict(cluster, model, backend, GPUS[fig], c)["predicted_ms"] for c in CAPS}
                best, worst = min(ms, key=ms.get), max(ms, key=ms.get)
                spread = band(lambda at: _spread(cluster, model, backend, GPUS[fig], at))
                rows.append(
                    (
                        f"{fig} bucket size, {model}/{backend}, {GPUS[fig]} GPUs",
                        f"best {common.fmt_mb(best)} MiB, worst {common.fmt_mb(worst)} MiB, best vs worst "
                        f"{_fmt(spread, 'x', 2)}",
                        "more than 2x; best between the extremes; BERT's larger",
                    )
                )
    for model in models:
        for backend in BACKENDS:
            eff = band(
                lambda at: (
                    100
                    * predict(cluster, model, backend, 1, at=at)["predicted_ms"]
                    / predict(cluster, model, backend, 256, at=at)["predicted_ms"]
                )
            )
            rows.append(
                (f"fig9 weak scaling, {model}/{backend}, 1 -> 256 GPUs", f"efficiency {_fmt(eff, '%')}", "near-linear")
            )
    return rows


def _spread(cluster, model, backend, gpus, at) -> float:
    ms = [predict(cluster, model, backend, gpus, c, at=at)["predicted_ms"] for c in CAPS]
    return max(ms) / min(ms)


def published_checks(cluster=DEFAULT_CLUSTER) -> list[tuple[str, str, str, str]]:
    """Published multi-GPU DDP runs on the paper's shape of cluster (simulator.model.cluster_data.PUBLISHED_SCALING):
    the one-GPU throughput calibrates the compute, the multi-GPU ones only check it. (point, simulated ms with band,
    measured ms, miss of the middle)."""
    from simulator.model.cluster_data import PUBLISHED_SCALING

    rows = []
    for (model, batch), runs in PUBLISHED_SCALING.items():
        for gpus, per_s in runs.items():
            if gpus == 1:
                continue
            measured = batch * gpus / per_s * 1000
            sim = predicted_band(cluster, model, "nccl", gpus, float(DEFAULT_BUCKET_CAP_MB), batch=batch)
            rows.append(
                (
                    f"{model} batch {batch}, {gpus} GPUs",
                    _fmt(sim, " ms"),
                    f"{measured:.0f} ms",
                    f"{100 * (sim[1] / measured - 1):+.0f}%",
                )
            )
    return rows


def main(argv=None) -> int:
    from harness.cli import OneLineParser
    from harness.launch.errors import command_line, refusing

    def body() -> int:
        parser = OneLineParser(prog="python -m experiments paper-scale", description=__doc__.split("\n\n")[0])
        parser.add_argument(
            "--cluster",
            default=DEFAULT_CLUSTER,
            help=f"the named GPU cluster simulated (simulator/model/cluster_data.py) (default: {DEFAULT_CLUSTER})",
        )
        parser.add_argument(
            "--bandwidth", type=float, default=1.0, help="every link's bandwidth times this (default: 1.0)"
        )
        ns = parser.parse_args(argv)
        with refusing():
            from simulator.model.clusters import cluster

            chosen = cluster(ns.cluster).with_bandwidth(ns.bandwidth)
        print("\n".join(" | ".join(row) for row in claims_at_scale(chosen)))
        print("published multi-GPU runs (one GPU calibrates, the rest check):")
        print("\n".join(" | ".join(row) for row in published_checks(chosen)))
        return 0

    return command_line("python -m experiments paper-scale", body)


if __name__ == "__main__":
    sys.exit(main())
