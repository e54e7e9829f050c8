"""DDP's host work on backward's thread, per gradient and per bucket, from backwards timed with and without DDP.

Where compute is short (many small parameters, or a fast device), what DDP's hooks and bucket launches cost on
backward's thread sets the iteration, and it is no property of the wire. With ``n`` gradients, and the copies into
the buckets and back out priced apart, a backward under DDP with ``B`` buckets costs ``n·g + B·b`` over one without
DDP; two bucket layouts give ``g`` (per gradient, with DDP's other passes over the gradients' bytes, such as the
averaging multiply) and ``b`` (per bucket). The probe times those backwards on this machine
(:mod:`simulator.probe.stand_in`); a named cluster states its numbers (:mod:`simulator.model.cluster_data`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HostCost:
    """One rank's DDP host work on backward's thread (ms), and the backward medians it came from."""

    per_gradient_ms: float
    per_bucket_ms: float
    backward_ms: tuple[float, float, float]  # no DDP, and DDP at each of the two layouts


def solve(
    backward_ms: tuple[float, float, float], gradients: int, copy_ms: float, buckets: tuple[int, int] | None = None
) -> HostCost:
    """``g`` and ``b`` from the three backwards (no DDP, then the two layouts of ``buckets`` buckets; calibration v15
    measured one bucket and one per gradient, the default); ``copy_ms``: the copies the simulator already prices,
    into the buckets and back out. Never negative, as noise between the medians can make a difference."""
    few, many = buckets or (1, gradients)
    none, first, second = backward_ms
    per_bucket = max((second - first) / (many - few), 0.0) if many > few else 0.0  # one parameter (per dtype)
    per_gradient = max((first - none - few * per_bucket - copy_ms) / gradients, 0.0)
    return HostCost(per_gradient, per_bucket, backward_ms)
