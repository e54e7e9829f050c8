"""What every figure driver shares: the driver contract, the settings timed figures share, which backends this
machine can run, and which stored rows a figure reads. Drawing is in ``experiments/plotting.py``.

A driver is a module ``experiments/figures/figNN_<what>.py`` that exposes
    FIGURE = "fig7"                 the experiment name (results/<FIGURE>/, results/figures/<FIGURE>.png)
    Config                          a dataclass of sweep settings; every field is a --key=value override
    PAPER                           the paper's claims for this figure, for the plot and REPRODUCTION.md
    points(cfg) -> list             the harness point configs to measure
    plot(df, cfg) -> Figure         draws the figure from the stored rows alone
    summarize(df, cfg) -> str       optional: one paragraph of measured-vs-claimed numbers
    claims(df, cfg) -> list[Claim]  optional: its numbers beside the paper's (``make claims``)
``python -m experiments`` finds drivers by listing that folder (see ``experiments/registry.py``). A timed
figure's Config extends :class:`Timed` or :class:`ModelSweep` (the settings they all share) and ends its plot
with :func:`experiments.plotting.finish`, so a driver holds only what its figure adds; the statistics over
repetitions are in ``experiments/verdicts.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ddp_impl.autotune import AUTO
from ddp_impl.options import DEFAULT_BUCKET_CAP_MB
from harness import TrainConfig
from harness.config import DEFAULT_NET
from harness.launch import env


@dataclass(frozen=True)
class Timed:
    """Settings every timed figure shares; every field is a --key=value override."""

    backends: tuple[str, ...] = ("gloo", "nccl")  # gloo | nccl | mpi; those this machine cannot run are left out
    profile: str = "auto"  # paper | cpu | auto (cpu without a GPU): input sizes, see harness.workloads.models
    iters: int = 10  # measured iterations per point, repetition and rank
    warmup: int = 2  # iterations run before measuring, per point and repetition, never stored
    # the link emulated per rank on CPU-only machines: RATE (e.g. 1gbit) | auto | loopback = none (harness/README.md)
    net: str = DEFAULT_NET
    hosts: int = 1  # emulated hosts (the paper's servers): ranks split evenly, net = each host's link
    repeats: int = 3  # each point measured this many times, in passes over the whole sweep (harness.sweep)
    order_seed: int = 0  # seeds the shuffled order of each pass


@dataclass(frozen=True)
class ModelSweep(Timed):
    """A timed figure of training iterations, one panel per (model, backend)."""

    # the models, a panel each (harness.workloads.models):
    # small | resnet50 | resnet101 | bert-base | bert-large | tiny-layers
    models: tuple[str, ...] = ("resnet50", "bert-base")

    def train_points(self, world_size: int, **fields) -> list[TrainConfig]:
        """One point per model and backend this machine can run at ``world_size``, the shared settings (which
        ``fields`` may override) plus ``fields``."""
        backends, _ = split_backends(self.backends, world_size)
        hosts = 1 if fields.get("impl") == "local" else self.hosts  # no communication, nothing between hosts
        shared = dict(profile=self.profile, iters=self.iters, warmup=self.warmup, net=self.net, hosts=hosts)
        return [
            TrainConfig(model=m, backend=b, world_size=world_size, repeat=r, **{**shared, **fields})
            for r in range(self.repeats)
            for m in self.models
            for b in backends
        ]


def ranks(cfg) -> str:
    """ "4 ranks", or "4 ranks on 2 emulated hosts", for titles."""
    hosts = getattr(cfg, "hosts", 1)
    return f"{cfg.world_size} ranks" + (f" on {hosts} emulated hosts" if hosts > 1 else "")


def cuda_gpus() -> int:
    return env.cuda_devices() if env.cuda_available() else 0


def mpi_available() -> bool:
    import torch.distributed as dist

    return dist.is_mpi_available()


def split_backends(backends, world_size: int) -> tuple[list[str], dict[str, str]]:
    """The requested backends this machine can run at ``world_size``, and why the others cannot."""
    usable, unavailable = [], {}
    gpus, local = cuda_gpus(), env.ranks_on_this_node(world_size)
    for b in backends:
        if b == "nccl" and gpus < local:
            unavailable[b] = (
                f"NCCL unavailable here: {gpus} CUDA GPU(s) for {local} ranks (run on a GPU machine or cluster)"
            )
        elif b == "mpi" and not mpi_available():
            unavailable[b] = "MPI unavailable here: this torch build has no MPI (torch.distributed.is_mpi_available())"
        else:
            usable.append(b)
    return usable, unavailable


def left_out_backends(cfg) -> dict[str, str]:
    """The backends of ``cfg.backends`` that this machine cannot run at one of the Config's world sizes (or more),
    and why; a ValueError naming why if it can run none of them at any, since the sweep would then be empty."""
    requested = tuple(getattr(cfg, "backends", ()))
    sizes = tuple(getattr(cfg, "world_sizes", ())) or (getattr(cfg, "world_size", 1),)
    usable, left_out = set(), {}
    for ws in sizes:
        runs, unavailable = split_backends(requested, ws)
        usable.update(runs)
        for b, why in unavailable.items():
            left_out.setdefault(b, why)
    if hasattr(cfg, "backends") and not usable:
        why = "; ".join(left_out.values()) or "it names none (choose gloo, nccl or mpi)"
        raise ValueError(f"backends={','.join(requested)!r}: nothing this machine can run: {why}")
    return left_out


def missing_backends(rows: pd.DataFrame, backends, world_size: int) -> dict[str, str]:
    """The requested backends with no stored rows that this machine cannot run either, and why: they get no
    panel, only a caption line. Stored rows always show, whatever machine draws them (NCCL results plotted on a
    CPU-only machine keep their panels)."""
    _, unavailable = split_backends(backends, world_size)
    stored = set(rows["backend"]) if len(rows) and "backend" in rows.columns else set()
    return {b: why for b, why in unavailable.items() if b not in stored}


def ok_rows(df: pd.DataFrame, synced_only: bool = True, net: str | None = None, hosts: int = 1) -> pd.DataFrame:
    """Measured rows of successful points (failed points are stored as a single row with ``error``);
    with ``net``, only those measured over that network and number of emulated hosts (see :func:`for_net`)."""
    if df.empty:
        return df
    ok = df[df["error"].fillna("") == ""]
    if synced_only and "synced" in ok.columns:
        ok = ok[ok["synced"].fillna(True).astype(bool)]
    return ok if net is None else for_net(ok, net, hosts)


def for_net(df: pd.DataFrame, net: str, hosts: int = 1) -> pd.DataFrame:
    """Rows measured over the network a driver's ``net`` and ``hosts`` ask for, so runs with different
    ``--net``/``--hosts`` stored side by side are never mixed. ``auto`` also keeps the points where it meant
    loopback where they ran (NCCL or GPUs, torchrun, one rank, no communication): stored with ``net = loopback``
    and ``net_auto_loopback``. Points without communication (``impl=local``) run on one host whatever ``hosts``
    says. Reads stored columns only, never the plotting machine."""
    if df.empty or "net" not in df.columns:
        return df
    keep = df["net"] == net
    if net == "auto":
        keep |= (df["net"] == "loopback") & auto_meant_loopback(df)
    stored_hosts = df.get("hosts", pd.Series(1, index=df.index)).fillna(1)  # rows from before hosts existed: 1
    keep &= (stored_hosts == hosts) | (df.get("impl", pd.Series("", index=df.index)) == "local")
    return df[keep]


def auto_meant_loopback(df: pd.DataFrame) -> pd.Series:
    """Per row, whether ``net=auto`` resolved to loopback where the row was measured (``net_auto_loopback``);
    rows stored before that column existed are judged from their own columns by the same rule."""
    col = lambda name, fill: df.get(name, pd.Series(fill, index=df.index)).fillna(fill)  # noqa: E731
    judged = (
        (col("backend", "") == "nccl")
        | ~col("device_name", "cpu").isin(["cpu", ""])
        | (col("world_size", 2).astype(int) == 1)
        | (col("impl", "") == "local")
        | ~col("point_type", "TrainConfig").isin(["TrainConfig", "AllreduceConfig"])
    )
    stored = df.get("net_auto_loopback")
    return judged if stored is None else stored.astype("boolean").fillna(judged).astype(bool)


def fmt_mb(mb: float | str) -> str:
    if mb == AUTO or mb == AUTO_KEY:
        return AUTO
    return "0" if mb == 0 else (f"{mb:g}" if mb < 1000 else f"{mb / 1000:g}k")


AUTO_KEY = math.inf  # bucket_cap_mb="auto" rows where caps are an axis: after every fixed cap


def is_auto(ok: pd.DataFrame) -> pd.Series:
    """Rows of ``bucket_cap_mb="auto"`` points (their ``bucket_cap_mb`` is empty; ``bucket_cap_mb_used`` says where
    the search settled)."""
    if "autotune" not in ok.columns:
        return pd.Series(False, index=ok.index)
    return ok["autotune"].fillna(False).astype(bool)


def at_cap(ok: pd.DataFrame, cap: float | str) -> pd.Series:
    """Rows measured at ``cap``: a number of MiB, or "auto"."""
    auto = is_auto(ok)
    return auto if cap == AUTO else (ok["bucket_cap_mb"] == cap) & ~auto


def caps_as_keys(ok: pd.DataFrame) -> pd.DataFrame:
    """``ok`` with the "auto" rows' ``bucket_cap_mb`` set to :data:`AUTO_KEY`, so that caps group and sort with it."""
    return ok.assign(bucket_cap_mb=ok["bucket_cap_mb"].where(~is_auto(ok), AUTO_KEY))


def simulated_cap(cap: float | str) -> float:
    """The cap the paper-scale simulator draws for a driver's cap: "auto" is drawn at torch's default."""
    return float(DEFAULT_BUCKET_CAP_MB) if cap == AUTO else cap


def speedup_pct(slow_ms: float, fast_ms: float) -> float:
    """The paper's speedup convention: (slow - fast) / fast, in percent."""
    return math.nan if not fast_ms else 100.0 * (slow_ms - fast_ms) / fast_ms
