"""A calibration: everything a prediction for one point needs, as numbers, stored as a versioned JSON file so that a
prediction names what it came from.

It comes from a probe of this machine (:func:`simulator.probe.calibrate.calibrate`, which says what each number
measures) or, for a named GPU cluster, from stated numbers (:func:`simulator.model.clusters.cluster_calibration`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .comm import AlphaBeta
from .iteration import ComputeProfile

VERSION = 16  # changes whenever what the probe measures, or how, changes: a stored calibration of another version is
#               refused (Calibration.load), so a prediction never mixes numbers measured two ways
# earlier versions whose files differ only by fields added since, whose defaults give what they predicted then
EARLIER_READABLE = {
    10: "no host cost (0: the probe did not measure it)",
    11: "3 latency passes and 3 contention pairs (9 and 7 since)",
    12: "no latency contention (0: calls waiting out their latency cost compute nothing)",
    13: "compute as the slowest rank's medians (since: the slowest rank in each iteration)",
    14: "host cost from 400 Linear(8, 8) gradients (since: the point's model's parameters)",
    15: "host cost per bucket from one bucket per gradient (since: buckets of about 10 gradients), "
    "compute at one rank timed back to back (since: after DDP's iterations)",
}


@dataclass(frozen=True)
class Calibration:
    """Everything a prediction for one (model, profile, ranks, network, threads) needs: on this machine, from a probe;
    on a named cluster, from its stated numbers."""

    profile: ComputeProfile
    comm: AlphaBeta
    copy_ms_per_byte: float  # one memory copy of a gradient, per byte
    buffer_bytes: int  # broadcast by DDP before every forward (broadcast_buffers=True)
    point: dict  # the probed point's config columns, plus the network rate and the backend ("process_group") used
    fit: dict  # the alpha-beta fit's quality: r2, median/worst % error, samples
    meta: dict  # version, time, machine, git commit: what a prediction says it used
    # for the record, not used by predictions (slowest rank's medians): DDP's own phases beside the probe, and
    # compute alone before any DDP iteration (load() also reads files that name it "rest")
    ddp: dict = field(default_factory=dict)
    compute_before_ddp: dict = field(default_factory=dict)
    # DDP's own host work on backward's thread (simulator.model.scenario.with_host_overhead): the probe's host-bound
    # stand-in on the point's ranks (simulator.probe.stand_in), or a named cluster's stated numbers
    host_per_gradient_ms: float = 0.0
    host_per_bucket_ms: float = 0.0

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, stored_run: bool = False) -> "Calibration":
        """``stored_run``: read to draw a stored run again, where a calibration of an earlier version that this one
        only adds fields to (:data:`EARLIER_READABLE`) also loads, as it predicted then."""
        raw = json.loads(Path(path).read_text())
        version = raw.get("meta", {}).get("version")
        if version != VERSION and not (stored_run and version in EARLIER_READABLE):
            raise ValueError(
                f"{path}: calibration version {raw.get('meta', {}).get('version')!r}, this code reads "
                f"version {VERSION}; probe again"
            )
        if "rest" in raw:
            raw["compute_before_ddp"] = raw.pop("rest")
        return cls(**{**raw, "profile": ComputeProfile(**raw["profile"]), "comm": AlphaBeta(**raw["comm"])})
