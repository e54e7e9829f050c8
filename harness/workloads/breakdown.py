"""Reading how a timed iteration's backward split into compute and exposed communication, per implementation:
torch's DDP logger, ddp_impl's own timing, or the host's clocks where there is nothing to separate (the runner's
module docstring says which applies when).
"""

from __future__ import annotations

import json
import math

from harness.workloads.systems import DDP_IMPLS, ZERO_IMPLS

NS_PER_MS = 1e6


class Breakdown:
    """Reads the backward compute / communication split after each iteration, per implementation."""

    def __init__(self, impl: str, model):
        self.impl, self.model = impl, model
        self.last_seen = None  # torch: logger iteration; ours: last IterationTiming object

    def read(self, synced: bool, backward_ms: float) -> dict:
        nan = math.nan
        out = dict(
            backward_compute_ms=backward_ms,
            backward_comm_exposed_ms=0.0,
            ddp_forward_compute_ms=nan,
            ddp_backward_compute_ms=nan,
            ddp_backward_comm_ms=nan,
            ddp_overlap_ms=nan,
            bucket_times_json="",
            breakdown_source="host",
        )
        if self.impl in ZERO_IMPLS:  # communication inside the system's own backward: not separable here
            out.update(backward_compute_ms=nan, backward_comm_exposed_ms=nan)
            return out
        if self.impl not in DDP_IMPLS or not synced:  # local and threads: no communication to separate
            return out
        if self.impl == "torch":
            return self._torch(out)
        return self._ours(out)

    def _torch(self, out: dict) -> dict:
        try:
            self.model.logger.set_runtime_stats_and_log()
        except (AttributeError, RuntimeError):
            pass
        data = self.model._get_ddp_logging_data()
        iteration = data.get("iteration")
        if iteration is None or iteration == self.last_seen or "backward_comm_time" not in data:
            out["backward_comm_exposed_ms"] = math.nan
            return out
        self.last_seen = iteration
        comm = data["backward_comm_time"] / NS_PER_MS
        overlap = data["backward_compute_comm_overlap_time"] / NS_PER_MS
        out.update(
            ddp_forward_compute_ms=data["forward_compute_time"] / NS_PER_MS,
            ddp_backward_compute_ms=data["backward_compute_time"] / NS_PER_MS,
            ddp_backward_comm_ms=comm,
            ddp_overlap_ms=overlap,
            breakdown_source="torch_logger",
        )
        out.update(backward_compute_ms=out["ddp_backward_compute_ms"], backward_comm_exposed_ms=comm - overlap)
        return out

    def _ours(self, out: dict) -> dict:
        timing = getattr(self.model, "last_timing", None)
        if timing is None or timing is self.last_seen:
            out["backward_comm_exposed_ms"] = math.nan
            return out
        self.last_seen = timing
        t = timing.as_dict()
        out.update(
            ddp_forward_compute_ms=t["forward_compute_time_ms"],
            ddp_backward_compute_ms=t["backward_compute_time_ms"],
            ddp_backward_comm_ms=t["backward_comm_time_ms"],
            ddp_overlap_ms=t["backward_compute_comm_overlap_time_ms"],
            backward_compute_ms=t["backward_compute_time_ms"],
            backward_comm_exposed_ms=t["exposed_comm_time_ms"],
            breakdown_source="ours",
        )
        stamps = {
            "ready_ms": "bucket_ready_ms",
            "launch_ms": "bucket_launch_ms",
            "done_ms": "bucket_done_ms",
            "finish_ms": "bucket_finish_ms",
            "forward_end_ms": "forward_compute_time_ms",
            "backward_start_ms": "backward_start_ms",
            "backward_end_ms": "backward_end_ms",
        }
        buckets = {k: _round(t[name]) for k, name in stamps.items() if name in t}
        out["bucket_times_json"] = json.dumps(buckets, separators=(",", ":"))
        return out


def _round(value):
    return [None if x is None else round(x, 4) for x in value] if isinstance(value, list) else round(value, 4)
