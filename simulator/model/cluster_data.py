"""The named clusters' data: devices, published measurements and each cluster's numbers with their sources.

Kept apart from what :mod:`simulator.model.clusters` does with them (calibrations, bands, FLOP profiles), so that
a number and its source are read in one place. Each is an :class:`Assumption`, a low/mid/high range (the types they
are stated in: :mod:`simulator.model.cluster_types`).
"""

from __future__ import annotations

import functools

from .cluster_types import Assumption, Cluster, Compute, Device, HostOverhead
from .comm import AlphaBeta, TwoTier

# the H100's measurements: its profile shapes the H100 cluster, its DDP rows every cluster's host overhead
from .h100_measured import (
    _stored_profiles,
    fit_host_overhead,
)


def _gbit(alpha_ms: float, gbit_per_s: float) -> AlphaBeta:
    return AlphaBeta.from_bandwidth(alpha_ms, gbit_per_s)


# The paper's Figure 6 (32 GPUs, 25 MB buckets): how much faster an iteration is with communication overlapping
# backward than after it, per (model, backend), in percent (the paper's Section 5.1). A check, never an input.
PAPER_OVERLAP_SPEEDUP = {
    ("resnet50", "nccl"): 38.0,
    ("bert-base", "nccl"): 35.2,
    ("resnet50", "gloo"): 26.8,
    ("bert-base", "gloo"): 21.5,
}
PAPER_OVERLAP_GPUS = 32

# Single-GPU and multi-GPU training throughput of NVIDIA's PyTorch examples on 4 servers of 8 V100-SXM2 16 GB, one
# 100 Gbit/s InfiniBand NIC each (the paper's shape), NGC 20.03 (PyTorch 1.5), fp32, median of 5 runs of 100
# iterations: github.com/Oneflow-Inc/DLPerf, NVIDIADeepLearningExamples/PyTorch/{resnet50v1.5,BERT}/README.md.
DLPERF = "Oneflow-Inc/DLPerf, NVIDIADeepLearningExamples/PyTorch"
PUBLISHED_SCALING = {  # (model, per-GPU batch) -> {GPUs: samples/s}
    ("resnet50", 128): {1: 367.29, 8: 2887.65, 16: 5716.79, 32: 10917.09},  # ResNet50 v1.5, SGD
    ("bert-base", 32): {1: 119.6, 8: 921.32, 16: 1499.4, 32: 2885.81},  # pretraining, seq 128, Adam
}


V100 = Device("V100-SXM2 16 GB, fp32", memory_gbyte_s=900.0)
H100 = Device("H100 SXM 80 GB, torch defaults (TF32 convolutions, fp32 matmuls)", memory_gbyte_s=3350.0)

V100_COMPUTE = {
    ("resnet50", 32): Compute(
        Assumption(
            85.6,
            94.1,
            100.2,
            "ResNet50 fp32 on one V100-SXM2: 2.72 ms per image at batch 128 (367.3 images/s, NVIDIA's ResNet50 v1.5, "
            f"{DLPERF}/resnet50v1.5) and 2.67 ms (342.4 ms per iteration, torchvision ResNet50, "
            "github.com/sandeepkumar-skb/pytorch_experiments torchvision_exp/README.md); at batch 32 x1.09 per image, "
            "as NVIDIA's V100 fp32 ResNet50 inference slows from batch 128 to 32 (1229 -> 1127 images/s, "
            "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md); range x1 (batch "
            "128's rate) to x1.15",
        ),
        shape="fp32",
    ),
    ("bert-base", 8): Compute(
        Assumption(
            66.9,
            72.9,
            87.0,
            "BERT-base pretraining (seq 128, Adam) fp32 on one V100-SXM2 16 GB: 119.6 sequences/s at batch 32 "
            f"({DLPERF}/BERT) = 8.36 ms per sequence; at batch 8 x1.09 (ResNet50's batch penalty, an assumption), "
            "range x1 to x1.3 "
            "(a smaller batch, and HuggingFace's unfused layers against NVIDIA's fused ones)",
        ),
        shape="fp32",
    ),
    # the batches of the published multi-GPU measurements, to check the model against them
    ("resnet50", 128): Compute(
        Assumption(342.4, 348.5, 348.5, f"{DLPERF}/resnet50v1.5, one GPU (and torchvision's 342.4 ms)"), shape="fp32"
    ),
    ("bert-base", 32): Compute(Assumption(262.3, 267.6, 272.9, f"{DLPERF}/BERT, one GPU, +-2%"), shape="fp32"),
}


def _h100_compute() -> dict:
    """From the stored profile: ResNets in torch's default mode (TF32 convolutions), BERTs as fp32 (TF32 matmuls were
    off in both of its modes, so their difference is the machine's spread: the range)."""
    profiles = _stored_profiles()["profiles"]

    def total(mode: str, model: str) -> float:
        p = profiles[mode][model]
        return p["forward_ms"] + p["backward_ms"] + p["optimizer_ms"]

    out = {}
    for model, p in profiles["default"].items():
        if model.startswith("resnet"):
            t = total("default", model)
            out[model, p["batch"]] = Compute(
                Assumption(
                    0.95 * t,
                    t,
                    1.05 * t,
                    "H100 profile, default mode, +-5% (a GPU iteration's run-to-run spread, assumed)",
                ),
                shape="default",
            )
        else:
            lo, hi = sorted((total("fp32", model), total("default", model)))
            out[model, p["batch"]] = Compute(
                Assumption(lo, (lo + hi) / 2, hi, "H100 profile, its two modes (the same precision) as the range"),
                shape="fp32",
            )
    return out


@functools.lru_cache(maxsize=None)
def _h100_host() -> HostOverhead:
    g, k = fit_host_overhead()
    src = "torch's DDP against no DDP, ResNet50, one H100 (fit_host_overhead), +-20% (the no-DDP rows' 4% spread)"
    return HostOverhead(Assumption(0.8 * g, g, 1.2 * g, src), Assumption(0.8 * k, k, 1.2 * k, src))


def _v100_host() -> HostOverhead:
    h = _h100_host()
    src = (
        "the H100 host's (the same DDP reducer), from 0 (hidden: a V100 iteration is 2-3x the H100's, so the host "
        "may run ahead of the GPU) to 2x (a 2017 host CPU)"
    )
    return HostOverhead(
        Assumption(0.0, h.per_gradient_ms.mid, 2 * h.per_gradient_ms.mid, src),
        Assumption(0.0, h.per_bucket_ms.mid, 2 * h.per_bucket_ms.mid, src),
    )


NCCL_RANGE = Assumption(0.8, 1.0, 1.1, "NCCL's rates: -20% / +10% (nccl-tests' spread between systems of a class)")
GLOO_RANGE = Assumption(0.5, 1.0, 1.5, "Gloo's rates: nobody publishes them for GPU servers; -50% / +50%")
GLOO_SOURCE = (
    "Gloo with GPU tensors: 40 Gbit/s inside a server (TCP loopback with host staging), at most 20 Gbit/s "
    "or half a NIC across servers, 50/80 us per ring step: assumptions (the paper's Figure 2 shows Gloo "
    "several times slower than NCCL without giving numbers)"
)


def _gloo(network_gbit: float) -> TwoTier:
    return TwoTier(8, intra=_gbit(0.05, 40.0), inter=_gbit(0.08, min(20.0, 0.5 * network_gbit)))


def _v100_cluster(name: str, description: str, nic_gbit: float, nccl_gbit: float, network_source: str) -> Cluster:
    """8 x V100 per server over NVLink; what differs between the named V100 clusters is the network: a server's NIC
    rate and what NCCL's ring reaches between servers."""
    return Cluster(
        name=name,
        description=description,
        device=V100,
        gpus_per_host=8,
        compute=V100_COMPUTE,
        host=_v100_host(),
        links={"nccl": TwoTier(8, intra=_gbit(0.006, 960.0), inter=_gbit(0.015, nccl_gbit)), "gloo": _gloo(nic_gbit)},
        bandwidth={"nccl": NCCL_RANGE, "gloo": GLOO_RANGE},
        sources=(
            *(f"compute, {m} batch {b}: {c.iteration_ms.source}" for (m, b), c in V100_COMPUTE.items() if b in (32, 8)),
            "phases and ready times: the H100's fp32 profile of the same model and batch "
            "(simulator/model/h100_compute_profile.json); models without one: FLOP counts at the rate "
            "ResNet50's measurement implies",
            f"DDP host overhead: {_v100_host().per_gradient_ms.source}",
            "V100 memory bandwidth 900 GB/s (NVIDIA V100 datasheet): DDP's bucket copies",
            "NCCL over NVLink (8 GPUs): all-reduce bus bandwidth ~120 GB/s (960 Gbit/s) as nccl-tests report for "
            "DGX-1 class servers; 6 us per ring step inside a server, 15 us across (order of NCCL's own latency "
            "model; assumptions)",
            network_source,
            GLOO_SOURCE,
            NCCL_RANGE.source,
            GLOO_RANGE.source,
            "per-GPU batch: the suite's paper profile (ResNet50 32 x 224x224 images, BERT 8 x 128 tokens); the "
            "paper does not state its batch sizes",
        ),
    )


def _h100_cluster() -> Cluster:
    compute = _h100_compute()
    return Cluster(
        name="h100-class",
        description="8 H100 SXM per server over NVLink 4, 400 Gbit/s InfiniBand per GPU",
        device=H100,
        gpus_per_host=8,
        compute=compute,
        host=_h100_host(),
        links={
            "nccl": TwoTier(8, intra=_gbit(0.005, 3200.0), inter=_gbit(0.012, 0.8 * 8 * 400.0)),
            "gloo": _gloo(400.0),
        },
        bandwidth={"nccl": NCCL_RANGE, "gloo": GLOO_RANGE},
        sources=(
            *(f"compute, {m} batch {b}: {c.iteration_ms.source}" for (m, b), c in compute.items()),
            "phases and ready times: the same profile (simulator/model/h100_compute_profile.json: one H100 "
            "80GB HBM3, torch 2.11, CUDA events)",
            f"DDP host overhead: {_h100_host().per_gradient_ms.source}",
            "H100 memory bandwidth 3.35 TB/s (NVIDIA H100 SXM datasheet): DDP's bucket copies",
            "NCCL over NVLink 4 (8 GPUs, NVSwitch): all-reduce bus bandwidth ~400 GB/s (3200 Gbit/s; nccl-tests "
            "report 360-480 GB/s on 8 H100 SXM), 5 us per ring step (assumption)",
            "between servers: one 400 Gbit/s NIC per GPU, NCCL's rings one per NIC, at 80% of the 3.2 Tbit/s "
            "(as DGX-1's four 100 Gbit/s NICs reach ~40 GB/s bus bandwidth, nccl-tests issue 29); 12 us per step",
            GLOO_SOURCE,
            NCCL_RANGE.source,
            GLOO_RANGE.source,
        ),
    )


CLUSTERS: dict[str, Cluster] = {
    c.name: c
    for c in (
        _v100_cluster(
            "paper-v100",
            "the paper's: servers of 8 V100 over NVLink, 100 Gbit/s between servers",
            100.0,
            90.0,
            "servers joined by 100 Gbit/s (the paper's Section 5: 4 servers of 8 V100, one 100 Gbit/s "
            "InfiniBand NIC each, as DLPerf's V100 cluster has); NCCL reaches 90% of it",
        ),
        _v100_cluster(
            "dgx1-v100",
            "DGX-1 class: 8 V100-SXM2 over NVLink, 4 x 100 Gbit/s InfiniBand per server",
            100.0,
            320.0,
            "servers joined by four 100 Gbit/s InfiniBand NICs each (DGX-1 system architecture white paper); "
            "NCCL's all-reduce bus bandwidth across DGX-1s ~40 GB/s = 320 Gbit/s (NVIDIA's GTC 2017 S7155 as "
            "cited in NVIDIA/nccl-tests issue 29)",
        ),
        _v100_cluster(
            "cloud-v100-25g",
            "a common cloud shape (AWS p3.16xlarge): 8 V100 over NVLink, 25 Gbit/s between servers",
            25.0,
            22.5,
            "servers joined by 25 Gbit/s Ethernet (AWS p3.16xlarge instance specification); NCCL reaches 90% of it",
        ),
        _h100_cluster(),
    )
}
