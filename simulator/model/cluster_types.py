"""What a named cluster is stated in: ranges with their sources, a device, its compute and host overhead, the cluster.

Apart from the numbers themselves (:mod:`simulator.model.cluster_data`), so that module reads as data only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .comm import AlphaBeta, TwoTier

LOW, MID, HIGH = "low", "mid", "high"


@dataclass(frozen=True)
class Assumption:
    """A number a cluster takes from elsewhere: its range and where it comes from."""

    low: float
    mid: float
    high: float
    source: str = ""

    def __post_init__(self):
        if not 0 <= self.low <= self.mid <= self.high:
            raise ValueError(f"need 0 <= low <= mid <= high, got {self.low}, {self.mid}, {self.high}")

    def at(self, which: str) -> float:
        return {LOW: self.low, MID: self.mid, HIGH: self.high}[which]

    def times(self, factor: float) -> "Assumption":
        return replace(self, low=self.low * factor, mid=self.mid * factor, high=self.high * factor)


@dataclass(frozen=True)
class Compute:
    """One GPU's training iteration without DDP (forward, backward, optimizer step) for ``model`` at ``batch``."""

    iteration_ms: Assumption
    shape: str  # which mode of the H100 profile splits it into phases and ready times ("fp32" or "default")


@dataclass(frozen=True)
class HostOverhead:
    """DDP's own work on backward's thread: each gradient's hook and each bucket's launch delay every later gradient
    and the backward's end (on the critical path where the host, not the GPU, sets the pace)."""

    per_gradient_ms: Assumption
    per_bucket_ms: Assumption


@dataclass(frozen=True)
class Device:
    name: str
    memory_gbyte_s: float  # prices DDP's copies into and out of buckets


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    device: Device
    gpus_per_host: int
    links: dict[str, TwoTier]  # backend -> its ring over this cluster's two tiers, at the middle of its range
    bandwidth: dict[str, Assumption]  # backend -> range of a factor on every link's bandwidth
    compute: dict[tuple[str, int], Compute]  # (model, per-GPU batch) -> its measured iteration
    host: HostOverhead
    sources: tuple[str, ...] = field(default=())

    def with_bandwidth(self, factor: float) -> "Cluster":
        """Every link's bandwidth times ``factor``: how much a conclusion leans on the assumed rates."""
        if not 0 < factor < math.inf:
            raise ValueError(f"bandwidth factor must be finite and > 0, got {factor}")
        links = {b: _scaled(t, factor) for b, t in self.links.items()}
        return replace(self, name=f"{self.name} x{factor:g} bandwidth", links=links)

    def comm(self, backend: str, which: str = MID) -> TwoTier:
        if backend not in self.links:
            raise ValueError(
                f"cluster {self.name!r} has no numbers for backend {backend!r}; it has {sorted(self.links)}"
            )
        return _scaled(self.links[backend], self.bandwidth[backend].at(which))


def _scaled(t: TwoTier, factor: float) -> TwoTier:
    def ab(x: AlphaBeta) -> AlphaBeta:
        return AlphaBeta(x.alpha_ms, x.beta_ms_per_byte / factor)

    return TwoTier(t.gpus_per_host, ab(t.intra), ab(t.inter))
