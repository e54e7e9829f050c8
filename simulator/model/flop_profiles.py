"""The figures' models' FLOP counts, stored per torch version (``flop_profiles.json``), which shape and price compute
on a named cluster where no profile measured it. Counting a model the file lacks builds it, which takes the harness:
that is the probe part's (:func:`simulator.probe.flops.count_flops`), passed in as ``count``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch


@dataclass(frozen=True)
class FlopProfile:
    """One GPU's operations for one iteration of ``model`` at the paper's per-GPU batch."""

    param_bytes: tuple[int, ...]  # in model.parameters() order, as DDP registers them
    ready_flops: tuple[float, ...]  # backward operations done when each gradient is ready
    forward_flops: float
    backward_flops: float
    buffer_bytes: int
    batch: int  # the paper's per-GPU batch (harness.workloads.models' "paper" profile), at which these are counted


FlopCounter = Callable[[str], FlopProfile]  # a model's name to its counted FlopProfile
STORED_FLOPS = Path(__file__).with_name("flop_profiles.json")  # counted FLOPs of the figures' models, this torch


@functools.lru_cache(maxsize=None)
def flop_profile(model: str, count: FlopCounter | None = None) -> FlopProfile:
    """``model``'s FLOP profile as :data:`STORED_FLOPS` holds it for this torch, else as ``count`` counts it
    (:func:`simulator.probe.flops.count_flops`, ~12 s a model, which every figure with a simulated panel would pay
    without the stored ones); without ``count``, a model the file lacks is refused."""
    stored = json.loads(STORED_FLOPS.read_text()) if STORED_FLOPS.exists() else {}
    entry = stored.get(_stored_key(model))
    if entry:
        return FlopProfile(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
    if count is None:
        raise LookupError(
            f"{STORED_FLOPS.name} holds no FLOP profile of {model!r} for torch {torch.__version__}: "
            "count it (simulator.probe.flops: count_flops, counted_cluster_calibration), or store it "
            "(simulator.probe.flops.store_flop_profiles)"
        )
    return count(model)


def save_flop_profiles(profiles: dict[str, FlopProfile]) -> None:
    """Write ``profiles`` (by model) to :data:`STORED_FLOPS`, as this torch's."""
    table = {_stored_key(m): asdict(fp) for m, fp in profiles.items()}
    STORED_FLOPS.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in table.items()) + "\n}\n")


def _stored_key(model: str) -> str:
    return f"{model} torch {torch.__version__}"


def paper_batch(model: str, count: FlopCounter | None = None) -> int:
    """The paper profile's per-GPU batch of ``model``, as its FLOP profile records it."""
    return flop_profile(model, count).batch
