"""An iteration's proportions, which split a cluster's measured iteration time into phases and ready times: from the
H100 profile of the same model where it has one, else from FLOP counts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .flop_profiles import FlopCounter, flop_profile
from .h100_measured import _stored_profiles


@dataclass(frozen=True)
class Shape:
    """An iteration's proportions: phases as fractions of the iteration, ready times as fractions of backward."""

    forward: float
    backward: float
    optimizer: float
    ready: tuple[float, ...]
    source: str


@functools.lru_cache(maxsize=None)
def measured_shape(model: str, mode: str, count: FlopCounter | None = None) -> Shape | None:
    """The H100 profile's proportions for ``model`` (``mode``: "fp32" or "default"), None where it has none."""
    p = _stored_profiles()["profiles"].get(mode, {}).get(model)
    if p is None:
        return None
    if [4 * n for n in p["numel"]] != list(flop_profile(model, count).param_bytes):
        raise ValueError(f"the H100 profile's parameters of {model} are not this model's")
    total = p["forward_ms"] + p["backward_ms"] + p["optimizer_ms"]
    return Shape(
        p["forward_ms"] / total,
        p["backward_ms"] / total,
        p["optimizer_ms"] / total,
        tuple(min(r / p["backward_ms"], 1.0) for r in p["ready_ms"]),
        f"H100 profile ({mode}, batch {p['batch']})",
    )


def flop_shape(model: str, memory_gbyte_s: float, flops_per_ms: float, count: FlopCounter | None = None) -> Shape:
    """Proportions from FLOP counts (forward, backward, ready times) and the optimizer's memory traffic."""
    fp = flop_profile(model, count)
    opt_ms = 3 * sum(fp.param_bytes) / (memory_gbyte_s * 1e6)  # SGD: read weight and grad, write weight
    f, b = fp.forward_flops / flops_per_ms, fp.backward_flops / flops_per_ms
    total = f + b + opt_ms
    return Shape(
        f / total, b / total, opt_ms / total, tuple(r / fp.backward_flops for r in fp.ready_flops), "FLOP counts"
    )
