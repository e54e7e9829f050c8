"""Named GPU clusters, so the simulator can speak at the paper's scale (16-256 GPUs) where nothing is measured here.

A prediction for this machine comes from a probe (:mod:`simulator.probe.calibrate`); a cluster has no probe, so its
:class:`~simulator.model.calibration.Calibration` is built from measurements made elsewhere, each a low/mid/high range
with its source (:class:`Assumption`):

* compute: one GPU's iteration without DDP for the model at the per-GPU batch, from published single-GPU training
  measurements of the device or from a measured profile (``h100_compute_profile.json``, one H100; model, batch,
  precision and source in each :class:`Compute`); split into forward, backward, optimizer step and each gradient's
  ready time by the measured H100 profile of the same model, batch and precision (:func:`measured_shape`). FLOP counts
  shape only models no profile holds (on the H100 a gradient's ready time as a fraction of backward differs from its
  FLOP fraction by 0.05-0.09 on average, 0.13-0.14 at worst), with compute at the rate the device's ResNet50
  measurement implies. The counts, and each model's parameters and paper batch, come from :data:`STORED_FLOPS`;
  counting a model it lacks builds the model, which takes the harness, so that is the probe part's
  (:func:`simulator.probe.flops.count_flops`), passed in as ``count``;
* DDP's host overhead: a cost per gradient and per bucket on backward's thread (:class:`HostOverhead`), from torch's
  DDP against no DDP on one H100 (:func:`fit_host_overhead`; BERT-base there and a second H100 run validate it,
  :func:`host_check`);
* communication: a two-tier ring per backend (:class:`~simulator.model.comm.TwoTier`): NVLink inside a server, the
  servers' NICs between them, at published rates; Gloo's are assumptions with a wide range.

No number is fitted to the paper's results: its figures are checks (``python -m experiments paper-scale``), and so
are published multi-GPU measurements (:data:`PUBLISHED_SCALING`), which calibrate nothing. A prediction's band comes
from each assumption's range (:func:`band` over :data:`CORNERS`). ``python -m experiments predict --cluster=NAME``.
The numbers themselves, with their sources, are in :mod:`simulator.model.cluster_data`; the FLOP counts in
:mod:`simulator.model.flop_profiles`, an iteration's proportions in :mod:`simulator.model.shapes`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ddp_impl.options import DEFAULT_BUCKET_CAP_MB

from .calibration import VERSION, Calibration
from .cluster_data import CLUSTERS, PAPER_OVERLAP_GPUS
from .cluster_types import HIGH, LOW, MID, Cluster
from .flop_profiles import FlopCounter, flop_profile, paper_batch
from .h100_measured import H100_DDP
from .iteration import ComputeProfile
from .scenario import Scenario, predict
from .shapes import flop_shape, measured_shape


@dataclass(frozen=True)
class Corner:
    """Which end of each assumption's range a prediction takes (``low`` compute and host: faster; ``low``
    bandwidth: slower links)."""

    compute: str = MID
    bandwidth: str = MID
    host: str = MID


MIDDLE = Corner()
CORNERS = tuple(Corner(c, b, h) for c in (LOW, HIGH) for b in (LOW, HIGH) for h in (LOW, HIGH))


def host_check(
    model: str = "bert-base", cluster_name: str = "h100-class", measured: dict = H100_DDP, count=None
) -> dict[int, tuple[float, float]]:
    """Validation of the host overhead on measurements that did not calibrate it (another model, or another run:
    ``measured=H100_DDP_CHECK``): per cap, (predicted, measured) ms of torch's DDP on one H100, the prediction being
    the measured no-DDP time plus what the model adds for DDP; ``count``: as :func:`flop_profile`'s."""
    out = {}
    for cap, (alone, ddp) in measured[model].items():
        cal = cluster_calibration(cluster_name, model, "nccl", 1, count=count)
        added = (
            predict(cal, Scenario(bucket_cap_mb=cap))["predicted_ms"]
            - cal.profile.forward_ms
            - cal.profile.backward_ms
            - cal.profile.optimizer_ms
        )
        out[cap] = (alone + added, ddp)
    return out


def cluster(name: "str | Cluster") -> Cluster:
    if isinstance(name, Cluster):
        return name
    if name not in CLUSTERS:
        raise ValueError(f"unknown cluster {name!r}; choose one of {sorted(CLUSTERS)}")
    return CLUSTERS[name]


def compute_profile(
    name: "str | Cluster", model: str, batch: int | None = None, which: str = MID, count: FlopCounter | None = None
) -> ComputeProfile:
    """One GPU's compute-only iteration of ``model`` at ``batch`` (the paper profile's by default) on a cluster: its
    measured iteration time split by the measured shape; where it has no measurement, the FLOP count at the rate
    its device's ResNet50 measurement implies, shaped by FLOPs (the fallback says so in its calibration's sources).
    ``count``: as :func:`flop_profile`'s."""
    c = cluster(name)
    batch = batch or paper_batch(model, count)
    fp = flop_profile(model, count)
    entry = c.compute.get((model, batch))
    if entry is not None:
        shape = measured_shape(model, entry.shape, count) or flop_shape(
            model, c.device.memory_gbyte_s, _flop_rate(c, count=count), count
        )
        total = entry.iteration_ms.at(which)
    else:
        rate = _flop_rate(c, which, count)
        shape = flop_shape(model, c.device.memory_gbyte_s, rate, count)
        scale = batch / paper_batch(model, count)
        total = ((fp.forward_flops + fp.backward_flops) * scale / rate) / (shape.forward + shape.backward)
    backward = shape.backward * total
    return ComputeProfile(
        param_bytes=fp.param_bytes,
        ready_ms=tuple(r * backward for r in shape.ready),
        backward_ms=backward,
        forward_ms=shape.forward * total,
        optimizer_ms=shape.optimizer * total,
    )


def _flop_rate(c: Cluster, which: str = MID, count: FlopCounter | None = None) -> float:
    """FLOPs per ms the cluster's ResNet50 measurement implies (forward and backward at the paper's batch)."""
    model, batch = "resnet50", paper_batch("resnet50", count)
    entry = c.compute[(model, batch)]
    shape = measured_shape(model, entry.shape, count)
    fp = flop_profile(model, count)
    return (fp.forward_flops + fp.backward_flops) / (entry.iteration_ms.at(which) * (shape.forward + shape.backward))


def cluster_calibration(
    name: "str | Cluster",
    model: str,
    backend: str,
    world_size: int,
    batch: int | None = None,
    at: Corner = MIDDLE,
    count: FlopCounter | None = None,
) -> Calibration:
    """What :func:`simulator.model.scenario.predict` needs for ``model`` on ``world_size`` GPUs of a cluster (or its
    name), each assumption at the end of its range that ``at`` names; ``count``: as :func:`flop_profile`'s."""
    c = cluster(name)
    comm = c.comm(backend, at.bandwidth).tier(world_size)
    batch = batch or paper_batch(model, count)
    profile = compute_profile(c, model, batch, at.compute, count)
    bytes_per_ms = c.device.memory_gbyte_s * 1e6
    return Calibration(
        profile=profile,
        comm=comm,
        copy_ms_per_byte=2 / bytes_per_ms,
        buffer_bytes=flop_profile(model, count).buffer_bytes,
        point=_point(c, model, backend, world_size, batch, comm.busbw_gbit),
        fit={},
        meta=dict(
            version=VERSION,
            created_at="named cluster",
            cluster=c.name,
            description=c.description,
            sources=_sources(c, model, batch),
            corner=asdict(at),
        ),
        host_per_gradient_ms=c.host.per_gradient_ms.at(at.host),
        host_per_bucket_ms=c.host.per_bucket_ms.at(at.host),
    )


def _point(c: Cluster, model: str, backend: str, world_size: int, batch: int, busbw_gbit: float) -> dict:
    """The point a cluster's calibration stands for, in a probed calibration's columns."""
    return dict(
        model=model,
        profile="paper",
        batch_size=batch,
        world_size=world_size,
        backend=backend,
        net=c.name,
        net_rate_mbit=busbw_gbit * 1e3,
        gpus_per_host=c.gpus_per_host,
        device=c.device.name,
    )


def _sources(c: Cluster, model: str, batch: int) -> list[str]:
    """The cluster's sources, and where ``model`` at ``batch`` was not measured on it, how its compute was found."""
    measured = (model, batch) in c.compute
    return list(c.sources) + (
        []
        if measured
        else [
            f"{model} at batch {batch}: no measurement on this device; FLOP counts at the rate its ResNet50 "
            "measurement implies, shaped by FLOPs"
        ]
    )


def band(fn) -> tuple[float, float, float]:
    """``(lowest, middle, highest)`` of ``fn(corner)`` over every corner of the assumptions' ranges."""
    values = [fn(at) for at in CORNERS]
    mid = fn(MIDDLE)
    return min(values + [mid]), mid, max(values + [mid])


def predicted_ms(
    name: "str | Cluster",
    model: str,
    backend: str,
    world_size: int,
    scenario=None,
    batch: int | None = None,
    at: Corner = MIDDLE,
    count: FlopCounter | None = None,
) -> float:
    cal = cluster_calibration(name, model, backend, world_size, batch, at, count)
    return predict(cal, scenario or Scenario())["predicted_ms"]


def overlap_speedup(
    name: "str | Cluster",
    model: str,
    backend: str,
    gpus: int = PAPER_OVERLAP_GPUS,
    bucket_cap_mb: float = float(DEFAULT_BUCKET_CAP_MB),
    at: Corner = MIDDLE,
    count: FlopCounter | None = None,
) -> float:
    """Percent by which overlapping communication with backward shortens the predicted iteration (Figure 6)."""
    on, off = (
        predicted_ms(name, model, backend, gpus, Scenario(bucket_cap_mb=bucket_cap_mb, overlap=o), at=at, count=count)
        for o in (True, False)
    )
    return (off / on - 1) * 100
