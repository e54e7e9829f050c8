"""``bucket_cap_mb="auto"`` on the DDP: what it refuses, the allreduce that makes every rank agree on each trial's
time, and the step each synchronized forward takes while the search (``cap_search``) runs."""

from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.distributed as dist

from .cap_search import AutoTuner
from .comm_hooks import ALIASES, resolve
from .construction import caps_bytes
from .options import DEFAULT_BUCKET_CAP_MB

AUTO = "auto"
STATELESS_HOOKS = set(ALIASES.values())  # torch's hooks that keep nothing per bucket: they survive a relayout


def requested(bucket_cap_mb, first_bucket_cap_mb, bucket_cap_mb_list, comm_hook) -> bool:
    """Whether the constructor's arguments ask for tuning; refused in one line where they cannot tune."""
    if bucket_cap_mb != AUTO:
        return False
    refuse_untunable(first_bucket_cap_mb, bucket_cap_mb_list, resolve(comm_hook) if comm_hook is not None else None)
    return True


def attach(ddp, bucket_cap_mb, tune: bool, prior_mb: Sequence[float] | None) -> None:
    """The DDP's tuning state: the tuner while it searches, the cap the buckets are laid out at now, and the log and
    result the search leaves (empty and None with a fixed cap). The log lists every trial: iteration, stage, round,
    cap_mb, ms agreed by every rank; the result, once settled: cap_mb, reason, iterations, settled_ms."""
    ddp._tuner = tuner_for(ddp, prior_mb) if tune else None
    ddp._autotune_prior, ddp._tuned_at = prior_mb, -1
    ddp.bucket_cap_mb_now = DEFAULT_BUCKET_CAP_MB if tune or bucket_cap_mb is None else bucket_cap_mb
    ddp.autotune_log = ddp._tuner.log if tune else []
    ddp.autotune_result = None


def refuse_untunable(first_bucket_cap_mb, bucket_cap_mb_list, comm_hook) -> None:
    """What ``bucket_cap_mb="auto"`` cannot be combined with, refused at construction in one line."""
    if first_bucket_cap_mb is not None or bucket_cap_mb_list:
        raise ValueError(
            "bucket_cap_mb='auto' chooses every bucket's cap: leave first_bucket_cap_mb and bucket_cap_mb_list unset"
        )
    if comm_hook is not None and comm_hook not in STATELESS_HOOKS:
        raise ValueError(
            "bucket_cap_mb='auto' lays the buckets out anew while it tunes, which a comm hook keeping state per "
            "bucket (such as PowerSGD) cannot follow: use a fixed cap, or torch's 'allreduce', 'fp16' or 'bf16' hook"
        )


def caps_for(cap_mb: float) -> tuple[int, int]:
    """(cap, first bucket's cap) in bytes of a candidate: the default is torch's whole default layout."""
    return caps_bytes(None if cap_mb == DEFAULT_BUCKET_CAP_MB else cap_mb, None)


def tuner_for(ddp, prior_mb: Sequence[float] | None) -> AutoTuner:
    group, device = ddp._primary, ddp.reducer.params[0].device

    def agree(ms: list[float]) -> list[float]:  # every rank takes the slowest rank's time of each trial
        times = torch.tensor(ms, dtype=torch.float64, device=device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
        return times.tolist()

    model_bytes = sum(s.nbytes for s in ddp.reducer.specs)
    return AutoTuner(model_bytes, agree, prior_mb)


def step(ddp) -> None:
    """At a synchronized forward of a DDP still tuning: the tuner's step and the layout it asks for. A forward with
    no reduction since the last step (no backward followed it) is not a step: only reductions are counted alike on
    every rank."""
    tuner, reducer = ddp._tuner, ddp.reducer
    if reducer.reductions == ddp._tuned_at:
        return
    ddp._tuned_at = reducer.reductions
    device = reducer.params[0].device
    _lay_out(ddp, tuner.on_forward(_now_ms(device)))
    if tuner.result is None:
        tuner.trial_started(_now_ms(device))


def stop(ddp, why: str) -> None:
    """Settle now on what the search resolved so far (every rank calls it at the same point), and lay out."""
    ddp._tuner.stop(why)
    _lay_out(ddp, ddp._tuner.result["cap_mb"])


def _lay_out(ddp, cap: float | None) -> None:
    """The buckets at ``cap`` (None: as they are); once the search has settled, the tuner dropped and the settled
    caps kept for a copy of the model (pickling rebuilds the reducer)."""
    tuner = ddp._tuner
    if cap is not None and cap != ddp.bucket_cap_mb_now:
        ddp.reducer.relayout(*caps_for(cap))
        ddp.bucket_cap_mb_now = cap
    if tuner.result is not None:
        ddp._tuner, ddp.autotune_result = None, tuner.result
        cap_bytes, first = caps_for(tuner.result["cap_mb"])
        ddp._reducer_args.update(cap_bytes=cap_bytes, first_cap_bytes=first)


def restart(ddp) -> None:
    """An unpickled copy of a DDP whose search had not settled: its reducer is new, at the default caps, so its search
    starts again."""
    attach(ddp, AUTO, True, ddp._autotune_prior)


def _now_ms(device: torch.device) -> float:
    if device.type == "cuda":  # the GPU's work of the trial belongs to it: wait for it (only while tuning)
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3
