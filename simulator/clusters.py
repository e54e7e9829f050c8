"""Named GPU clusters, so the simulator can speak at the paper's scale (16-256 GPUs) where nothing is measured.

A prediction for this machine comes from a probe (:mod:`simulator.calibrate`); a cluster has no probe, so its
:class:`~simulator.calibrate.Calibration` is built from stated numbers instead:

* compute: the model's floating-point operations at the paper's per-GPU batch, counted by torch's
  ``FlopCounterMode`` over one forward and backward (each parameter's gradient is ready once the backward has
  done the operations before its hook), divided by the device's *sustained* training rate, then scaled per model
  (``compute_scale``) so that the simulated NCCL overlap speedup at 32 GPUs is the paper's (Figure 6: the only
  numbers the paper reports from its latency breakdowns; the paper states neither its batch sizes nor its phase
  times); the optimizer step and DDP's bucket copies as memory traffic at the device's memory bandwidth;
* communication: a two-tier ring per backend (:class:`~simulator.comm.TwoTier`): GPUs of a host over their
  interconnect, hosts over the network; Gloo's rates, which nobody publishes for this setting, scaled by one
  factor so that the simulated Gloo overlap speedups come closest to the paper's (least squares over both models).

:func:`fit_to_paper` derives those factors; the stored ones are checked against it by the tests. Every other
number is an assumption with its source in ``sources``; none is measured here (this machine has no GPU), so a
cluster prediction is as good as these numbers and the simulator's validation on this machine (BENCHMARKS.md), no
better. ``python -m experiments predict --cluster=NAME`` uses them.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ddp_impl.reducer import hook_accumulators
from harness.models import InputSpec, build_model, compute_loss, input_spec, make_inputs

from .calibrate import VERSION, Calibration
from .comm import AlphaBeta, TwoTier
from .iteration import ComputeProfile


@dataclass(frozen=True)
class Device:
    name: str
    sustained_tflops: float  # fp32 training, end to end (not the datasheet's peak)
    memory_gbyte_s: float


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    device: Device
    gpus_per_host: int
    links: dict[str, TwoTier]  # backend -> its ring over this cluster's two tiers
    sources: tuple[str, ...] = field(default=())
    compute_scale: dict[str, float] = field(default_factory=dict)  # model -> factor on its FLOP-counted compute

    def with_bandwidth(self, factor: float) -> "Cluster":
        """Every link's bandwidth times ``factor``: how much a conclusion leans on the assumed rates."""
        if not factor > 0:
            raise ValueError(f"bandwidth factor must be > 0, got {factor}")

        def scaled(ab: AlphaBeta) -> AlphaBeta:
            return AlphaBeta(ab.alpha_ms, ab.beta_ms_per_byte / factor)

        links = {b: TwoTier(t.gpus_per_host, scaled(t.intra), scaled(t.inter)) for b, t in self.links.items()}
        return replace(self, name=f"{self.name} x{factor:g} bandwidth", links=links)

    def comm(self, backend: str) -> TwoTier:
        if backend not in self.links:
            raise ValueError(f"cluster {self.name!r} has no numbers for backend {backend!r}; "
                             f"it has {sorted(self.links)}")
        return self.links[backend]


V100 = Device("V100-SXM2 16 GB, fp32", sustained_tflops=9.1, memory_gbyte_s=900.0)

# The paper's Figure 6 (32 GPUs, 25 MB buckets): how much faster an iteration is with communication overlapping
# backward than after it, per (model, backend), in percent (paper-notes.md, [confirmed]).
PAPER_OVERLAP_SPEEDUP = {("resnet50", "nccl"): 38.0, ("bert-base", "nccl"): 35.2,
                         ("resnet50", "gloo"): 26.8, ("bert-base", "gloo"): 21.5}
PAPER_OVERLAP_GPUS = 32
# What fit_to_paper() gives for paper-v100 (tests check that it still does): the FLOP-counted compute at 9.1
# TFLOP/s times these reproduces the paper's NCCL speedups, and Gloo's nominal rates times GLOO_SCALE its Gloo ones
# as closely as one factor can.
V100_COMPUTE_SCALE = {"resnet50": 0.4753, "bert-base": 1.3543}
GLOO_SCALE = 1.265


def _gbit(alpha_ms: float, gbit_per_s: float) -> AlphaBeta:
    return AlphaBeta.from_bandwidth(alpha_ms, gbit_per_s)


def _v100_cluster(name: str, description: str, network_gbit: float, network_source: str,
                  compute_scale: dict[str, float] = V100_COMPUTE_SCALE, gloo_scale: float = GLOO_SCALE) -> Cluster:
    """8 x V100 per server over NVLink; what differs between the two named V100 clusters is the network."""
    return Cluster(
        name=name, description=description, device=V100, gpus_per_host=8, compute_scale=dict(compute_scale),
        links={
            # NCCL: NVLink ring inside a server, the server's NIC between servers
            "nccl": TwoTier(8, intra=_gbit(0.006, 960.0), inter=_gbit(0.015, 0.9 * network_gbit)),
            # Gloo: GPU tensors staged through host memory and sent over TCP, also inside a server
            "gloo": TwoTier(8, intra=_gbit(0.05, 40.0 * gloo_scale),
                            inter=_gbit(0.08, min(20.0, 0.5 * network_gbit) * gloo_scale)),
        },
        sources=(
            "V100 sustained fp32 training rate 9.1 TFLOP/s: torchvision ResNet50, batch 128, fp32, V100-SXM2, "
            "342 ms per iteration (github.com/sandeepkumar-skb/pytorch_experiments, torchvision_exp/README.md) "
            "= 374 images/s x 24.3 GFLOP per image (FlopCounterMode, forward + backward) = 58% of the 15.7 "
            "TFLOP/s peak; assumed the same for BERT",
            "forward and backward compute scaled per model (" + ", ".join(
                f"{m} x{f:g}" for m, f in compute_scale.items()) + ") so that the simulated NCCL overlap speedup "
            "at 32 GPUs and 25 MiB is the paper's (Figure 6: ResNet50 38.0%, BERT 35.2%; fit_to_paper on "
            "paper-v100), the only numbers the paper reports from its latency breakdowns: it states neither its "
            "per-GPU batches nor its phase times, and the scale stands for both; other models x1",
            "V100 memory bandwidth 900 GB/s (NVIDIA V100 datasheet); optimizer and bucket copies are memory-bound",
            "NCCL over NVLink (DGX-1/p3 class, 8 GPUs): all-reduce bus bandwidth ~120 GB/s (960 Gbit/s) as "
            "nccl-tests report for such servers; ring step latency 6 us inside a server, 15 us across (order of "
            "NCCL's own latency model); both assumptions",
            network_source,
            f"Gloo with GPU tensors: nominal 40 Gbit/s inside a server (TCP loopback with host staging), at most "
            f"20 Gbit/s or half the NIC across servers, 50/80 us per ring step (assumptions: the paper's Figure 2 "
            f"shows Gloo several times slower than NCCL without giving numbers), the rates times {gloo_scale:g}, "
            f"the one factor with which the simulated Gloo overlap speedups come closest to the paper's (Figure "
            f"6: ResNet50 26.8%, BERT 21.5%; least squares, fit_to_paper on paper-v100)",
            "per-GPU batch: the suite's paper profile (ResNet50 32 x 224x224 images, BERT 8 x 128 tokens); the "
            "paper does not state its batch sizes",
        ))


CLUSTERS: dict[str, Cluster] = {c.name: c for c in (
    _v100_cluster("paper-v100", "the paper's: servers of 8 V100 over NVLink, 100 Gbit/s between servers", 100.0,
                  "servers joined by 100 Gbit/s (the paper's setup as summarised in paper-notes.md, [likely]); NCCL "
                  "reaches 90% of it"),
    _v100_cluster("cloud-v100-25g", "a common cloud shape (AWS p3.16xlarge): 8 V100 over NVLink, 25 Gbit/s "
                  "between servers", 25.0,
                  "servers joined by 25 Gbit/s Ethernet (AWS p3.16xlarge instance specification); NCCL reaches 90% "
                  "of it"),
)}


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


def cluster_calibration(name: "str | Cluster", model: str, backend: str, world_size: int) -> Calibration:
    """What :func:`simulator.predict.predict` needs for ``model`` on ``world_size`` GPUs of a cluster (or its
    name)."""
    c = cluster(name)
    comm = c.comm(backend).tier(world_size)
    fp = flop_profile(model)
    flops_per_ms = c.device.sustained_tflops * 1e9 / c.compute_scale.get(model, 1.0)
    bytes_per_ms = c.device.memory_gbyte_s * 1e6
    grad_bytes = sum(fp.param_bytes)
    profile = ComputeProfile(param_bytes=fp.param_bytes, ready_ms=tuple(r / flops_per_ms for r in fp.ready_flops),
                             backward_ms=fp.backward_flops / flops_per_ms, forward_ms=fp.forward_flops / flops_per_ms,
                             optimizer_ms=3 * grad_bytes / bytes_per_ms)  # SGD: read weight and grad, write weight
    point = dict(model=model, profile="paper", world_size=world_size, backend=backend, net=c.name,
                 net_rate_mbit=comm.busbw_gbit * 1e3, gpus_per_host=c.gpus_per_host, device=c.device.name)
    return Calibration(profile=profile, comm=comm, copy_ms_per_byte=2 / bytes_per_ms, buffer_bytes=fp.buffer_bytes,
                       point=point, fit={}, meta=dict(version=VERSION, created_at="named cluster", cluster=c.name,
                                                      description=c.description, sources=list(c.sources)))


def overlap_speedup(name: "str | Cluster", model: str, backend: str, gpus: int = PAPER_OVERLAP_GPUS,
                    bucket_cap_mb: float = 25.0) -> float:
    """Percent by which overlapping communication with backward shortens the predicted iteration (Figure 6)."""
    from .predict import Scenario, predict

    cal = cluster_calibration(name, model, backend, gpus)
    on, off = (predict(cal, Scenario(bucket_cap_mb=bucket_cap_mb, overlap=o))["predicted_ms"] for o in (True, False))
    return (off / on - 1) * 100


def fit_to_paper(network_gbit: float = 100.0) -> tuple[dict[str, float], float]:
    """``(compute scale per model, Gloo rate factor)`` with which a V100 cluster on ``network_gbit`` reproduces the
    paper's overlap speedups: each model's compute scaled until its NCCL speedup is the paper's (the speedup rises
    and falls with compute, as backward first hides and then outgrows communication: the root nearest the FLOP
    count's own), then one factor on Gloo's nominal rates minimizing the squared misses of both Gloo speedups."""
    def cluster_with(scale: dict, gloo: float) -> Cluster:
        return _v100_cluster("fit", "", network_gbit, "", compute_scale=scale, gloo_scale=gloo)

    scale = {}
    for model in sorted({m for m, _ in PAPER_OVERLAP_SPEEDUP}):
        def miss(f: float, model: str = model) -> float:
            return overlap_speedup(cluster_with({model: f}, 1.0), model, "nccl") - PAPER_OVERLAP_SPEEDUP[model, "nccl"]

        scale[model] = _root_nearest_one(miss)

    def sse(gloo: float) -> float:
        c = cluster_with(scale, gloo)
        return sum((overlap_speedup(c, m, "gloo") - want) ** 2 for (m, b), want in PAPER_OVERLAP_SPEEDUP.items()
                   if b == "gloo")

    return scale, _argmin_log(sse, 0.25, 4.0)


def _root_nearest_one(fn, lo: float = 0.125, hi: float = 8.0, steps: int = 48) -> float:
    """The root of ``fn`` on [lo, hi] nearest 1 (log scale): bracketed on a log grid, then bisected."""
    grid = list(np.geomspace(lo, hi, steps + 1))
    values = [fn(x) for x in grid]
    brackets = [(a, b, fa) for a, b, fa, fb in zip(grid, grid[1:], values, values[1:]) if fa * fb <= 0]
    if not brackets:
        raise ValueError("no compute scale reproduces the paper's speedup on this cluster")
    a, b, fa = min(brackets, key=lambda br: abs(math.log(br[0] * br[1])))
    for _ in range(40):
        mid = math.sqrt(a * b)
        fm = fn(mid)
        a, b, fa = (mid, b, fm) if fa * fm > 0 else (a, mid, fa)
    return math.sqrt(a * b)


def _argmin_log(fn, lo: float, hi: float, steps: int = 40) -> float:
    """``fn``'s minimum on [lo, hi]: the best of a log grid, then golden-section search around it."""
    grid = list(np.geomspace(lo, hi, steps + 1))
    i = min(range(len(grid)), key=lambda k: fn(grid[k]))
    a, b = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, steps)])
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(30):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        a, b = (a, d) if fn(math.exp(c)) < fn(math.exp(d)) else (c, b)
    return math.exp((a + b) / 2)
