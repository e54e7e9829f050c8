"""Named GPU clusters, so the simulator can speak at the paper's scale (16-256 GPUs) where nothing is measured here.

A prediction for this machine comes from a probe (:mod:`simulator.calibrate`); a cluster has no probe, so its
:class:`~simulator.calibrate.Calibration` is built from measurements made elsewhere, each a low/mid/high range with
its source (:class:`Assumption`):

* compute: one GPU's iteration without DDP for the model at the per-GPU batch, from published single-GPU training
  measurements of the device or from a measured profile (``h100_compute_profile.json``, one H100; model, batch,
  precision and source in each :class:`Compute`); split into forward, backward, optimizer step and each gradient's
  ready time by the measured H100 profile of the same model, batch and precision (:func:`measured_shape`). FLOP counts
  shape only models no profile holds (on the H100 a gradient's ready time as a fraction of backward differs from its
  FLOP fraction by 0.05-0.09 on average, 0.13-0.14 at worst), with compute at the rate the device's ResNet50
  measurement implies;
* DDP's host overhead: a cost per gradient and per bucket on backward's thread (:class:`HostOverhead`), from torch's
  DDP against no DDP on one H100 (:func:`fit_host_overhead`; BERT-base there and a second H100 run validate it,
  :func:`host_check`);
* communication: a two-tier ring per backend (:class:`~simulator.comm.TwoTier`): NVLink inside a server, the
  servers' NICs between them, at published rates; Gloo's are assumptions with a wide range.

No number is fitted to the paper's results: its figures are checks (``python -m experiments.paper_scale``), and so
are published multi-GPU measurements (:data:`PUBLISHED_SCALING`), which calibrate nothing. A prediction's band comes
from each assumption's range (:func:`band` over :data:`CORNERS`). ``python -m experiments predict --cluster=NAME``.
The numbers themselves, with their sources, are in :mod:`simulator.cluster_data`.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ddp_impl.reducer import hook_accumulators
from harness.models import InputSpec, build_model, compute_loss, input_spec, make_inputs

from .calibrate import VERSION, Calibration
from .cluster_data import (CLUSTERS, H100_DDP, HIGH, LOW, MID, PAPER_OVERLAP_GPUS, Cluster, _stored_profiles)
# re-exported: what the figures and tests read from here
from .cluster_data import PAPER_OVERLAP_SPEEDUP, PUBLISHED_SCALING, Assumption, fit_host_overhead  # noqa: F401
from .iteration import ComputeProfile


@dataclass(frozen=True)
class Corner:
    """Which end of each assumption's range a prediction takes (``low`` compute and host: faster; ``low``
    bandwidth: slower links)."""

    compute: str = MID
    bandwidth: str = MID
    host: str = MID


MIDDLE = Corner()
CORNERS = tuple(Corner(c, b, h) for c in (LOW, HIGH) for b in (LOW, HIGH) for h in (LOW, HIGH))


@dataclass(frozen=True)
class Shape:
    """An iteration's proportions: phases as fractions of the iteration, ready times as fractions of backward."""

    forward: float
    backward: float
    optimizer: float
    ready: tuple[float, ...]
    source: str


@functools.lru_cache(maxsize=None)
def measured_shape(model: str, mode: str) -> Shape | None:
    """The H100 profile's proportions for ``model`` (``mode``: "fp32" or "default"), None where it has none."""
    p = _stored_profiles()["profiles"].get(mode, {}).get(model)
    if p is None:
        return None
    if [4 * n for n in p["numel"]] != list(flop_profile(model).param_bytes):
        raise ValueError(f"the H100 profile's parameters of {model} are not this model's")
    total = p["forward_ms"] + p["backward_ms"] + p["optimizer_ms"]
    return Shape(p["forward_ms"] / total, p["backward_ms"] / total, p["optimizer_ms"] / total,
                 tuple(min(r / p["backward_ms"], 1.0) for r in p["ready_ms"]),
                 f"H100 profile ({mode}, batch {p['batch']})")


def flop_shape(model: str, memory_gbyte_s: float, flops_per_ms: float) -> Shape:
    """Proportions from FLOP counts (forward, backward, ready times) and the optimizer's memory traffic."""
    fp = flop_profile(model)
    opt_ms = 3 * sum(fp.param_bytes) / (memory_gbyte_s * 1e6)  # SGD: read weight and grad, write weight
    f, b = fp.forward_flops / flops_per_ms, fp.backward_flops / flops_per_ms
    total = f + b + opt_ms
    return Shape(f / total, b / total, opt_ms / total, tuple(r / fp.backward_flops for r in fp.ready_flops),
                 "FLOP counts")


def host_check(model: str = "bert-base", cluster_name: str = "h100-class",
               measured: dict = H100_DDP) -> dict[int, tuple[float, float]]:
    """Validation of the host overhead on measurements that did not calibrate it (another model, or another run:
    ``measured=H100_DDP_CHECK``): per cap, (predicted, measured) ms of torch's DDP on one H100, the prediction being
    the measured no-DDP time plus what the model adds for DDP."""
    from .predict import Scenario, predict

    out = {}
    for cap, (alone, ddp) in measured[model].items():
        cal = cluster_calibration(cluster_name, model, "nccl", 1)
        added = predict(cal, Scenario(bucket_cap_mb=cap))["predicted_ms"] - cal.profile.forward_ms \
            - cal.profile.backward_ms - cal.profile.optimizer_ms
        out[cap] = (alone + added, ddp)
    return out


def cluster(name: "str | Cluster") -> Cluster:
    if isinstance(name, Cluster):
        return name
    if name not in CLUSTERS:
        raise ValueError(f"unknown cluster {name!r}; choose one of {sorted(CLUSTERS)}")
    return CLUSTERS[name]


@dataclass(frozen=True)
class FlopProfile:
    """One GPU's operations for one iteration of ``model`` at the paper's per-GPU batch."""

    param_bytes: tuple[int, ...]  # in model.parameters() order, as DDP registers them
    ready_flops: tuple[float, ...]  # backward operations done when each gradient is ready
    forward_flops: float
    backward_flops: float
    buffer_bytes: int


STORED_FLOPS = Path(__file__).with_name("flop_profiles.json")  # count_flops of the figures' models, this torch


@functools.lru_cache(maxsize=None)
def flop_profile(model: str) -> FlopProfile:
    """:func:`count_flops`, read from :data:`STORED_FLOPS` where it holds this model for this torch (counting takes
    ~12 s a model, which every figure with a simulated panel would pay)."""
    stored = json.loads(STORED_FLOPS.read_text()) if STORED_FLOPS.exists() else {}
    entry = stored.get(_stored_key(model))
    return FlopProfile(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}) if entry else \
        count_flops(model)


def store_flop_profiles(models=("resnet50", "bert-base")) -> None:
    """Write :data:`STORED_FLOPS` for ``models`` (``python -c "import simulator.clusters as c;
    c.store_flop_profiles()"`` after a torch or model change)."""
    table = {_stored_key(m): asdict(count_flops(m)) for m in models}
    STORED_FLOPS.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in table.items()) + "\n}\n")


def _stored_key(model: str) -> str:
    return f"{model} torch {torch.__version__}"


def count_flops(model: str) -> FlopProfile:
    """Counted on one sample on this CPU and scaled to the batch (every counted operation is linear in it)."""
    from torch.utils.flop_counter import FlopCounterMode

    spec = input_spec(model, "paper")
    torch.manual_seed(0)
    net = build_model(model)
    inputs = make_inputs(model, InputSpec(1, spec.image_size, spec.seq_len), torch.device("cpu"))
    counter = FlopCounterMode(display=False)

    def done() -> float:
        return float(sum(counter.get_flop_counts()["Global"].values()))

    ready: dict[int, float] = {}
    params = [p for p in net.parameters() if p.requires_grad]
    _accumulators, hooks = hook_accumulators(params, lambda i: lambda *_: ready.__setitem__(i, done()))
    with counter:
        loss = compute_loss(model, net, inputs)
        forward = done()
        loss.backward()
        total = done()
    for h in hooks:
        h.remove()
    b = spec.batch_size
    return FlopProfile(param_bytes=tuple(p.numel() * p.element_size() for p in params),
                       ready_flops=tuple((ready.get(i, total) - forward) * b for i in range(len(params))),
                       forward_flops=forward * b, backward_flops=(total - forward) * b,
                       buffer_bytes=sum(t.numel() * t.element_size() for t in net.buffers()))


def paper_batch(model: str) -> int:
    return input_spec(model, "paper").batch_size


def compute_profile(name: "str | Cluster", model: str, batch: int | None = None, which: str = MID) -> ComputeProfile:
    """One GPU's compute-only iteration of ``model`` at ``batch`` (the paper profile's by default) on a cluster: its
    measured iteration time split by the measured shape; where it has no measurement, the FLOP count at the rate
    its device's ResNet50 measurement implies, shaped by FLOPs (the fallback says so in its calibration's sources)."""
    c = cluster(name)
    batch = batch or paper_batch(model)
    fp = flop_profile(model)
    entry = c.compute.get((model, batch))
    if entry is not None:
        shape = measured_shape(model, entry.shape) or flop_shape(model, c.device.memory_gbyte_s, _flop_rate(c))
        total = entry.iteration_ms.at(which)
    else:
        rate = _flop_rate(c, which)
        shape = flop_shape(model, c.device.memory_gbyte_s, rate)
        scale = batch / paper_batch(model)
        total = ((fp.forward_flops + fp.backward_flops) * scale / rate) / (shape.forward + shape.backward)
    backward = shape.backward * total
    return ComputeProfile(param_bytes=fp.param_bytes, ready_ms=tuple(r * backward for r in shape.ready),
                          backward_ms=backward, forward_ms=shape.forward * total, optimizer_ms=shape.optimizer * total)


def _flop_rate(c: Cluster, which: str = MID) -> float:
    """FLOPs per ms the cluster's ResNet50 measurement implies (forward and backward at the paper's batch)."""
    model, batch = "resnet50", paper_batch("resnet50")
    entry = c.compute[(model, batch)]
    shape = measured_shape(model, entry.shape)
    fp = flop_profile(model)
    return (fp.forward_flops + fp.backward_flops) / (entry.iteration_ms.at(which) * (shape.forward + shape.backward))


def cluster_calibration(name: "str | Cluster", model: str, backend: str, world_size: int, batch: int | None = None,
                        at: Corner = MIDDLE) -> Calibration:
    """What :func:`simulator.predict.predict` needs for ``model`` on ``world_size`` GPUs of a cluster (or its name),
    each assumption at the end of its range that ``at`` names."""
    c = cluster(name)
    comm = c.comm(backend, at.bandwidth).tier(world_size)
    batch = batch or paper_batch(model)
    profile = compute_profile(c, model, batch, at.compute)
    measured = (model, batch) in c.compute
    bytes_per_ms = c.device.memory_gbyte_s * 1e6
    point = dict(model=model, profile="paper", batch_size=batch, world_size=world_size, backend=backend, net=c.name,
                 net_rate_mbit=comm.busbw_gbit * 1e3, gpus_per_host=c.gpus_per_host, device=c.device.name)
    sources = list(c.sources) + ([] if measured else [
        f"{model} at batch {batch}: no measurement on this device; FLOP counts at the rate its ResNet50 measurement "
        "implies, shaped by FLOPs"])
    return Calibration(profile=profile, comm=comm, copy_ms_per_byte=2 / bytes_per_ms,
                       buffer_bytes=flop_profile(model).buffer_bytes, point=point, fit={},
                       meta=dict(version=VERSION, created_at="named cluster", cluster=c.name,
                                 description=c.description, sources=sources, corner=asdict(at)),
                       host_per_gradient_ms=c.host.per_gradient_ms.at(at.host),
                       host_per_bucket_ms=c.host.per_bucket_ms.at(at.host))


def band(fn) -> tuple[float, float, float]:
    """``(lowest, middle, highest)`` of ``fn(corner)`` over every corner of the assumptions' ranges."""
    values = [fn(at) for at in CORNERS]
    mid = fn(MIDDLE)
    return min(values + [mid]), mid, max(values + [mid])


def predicted_ms(name: "str | Cluster", model: str, backend: str, world_size: int, scenario=None,
                 batch: int | None = None, at: Corner = MIDDLE) -> float:
    from .predict import Scenario, predict

    cal = cluster_calibration(name, model, backend, world_size, batch, at)
    return predict(cal, scenario or Scenario())["predicted_ms"]


def overlap_speedup(name: "str | Cluster", model: str, backend: str, gpus: int = PAPER_OVERLAP_GPUS,
                    bucket_cap_mb: float = 25.0, at: Corner = MIDDLE) -> float:
    """Percent by which overlapping communication with backward shortens the predicted iteration (Figure 6)."""
    from .predict import Scenario

    on, off = (predicted_ms(name, model, backend, gpus, Scenario(bucket_cap_mb=bucket_cap_mb, overlap=o), at=at)
               for o in (True, False))
    return (off / on - 1) * 100
