"""Per-iteration instrumentation, cheap enough to leave on.

Stamps are taken at forward start and end, backward start (the first gradient reaching a module output), the end
of backward (autograd done), the first bucket's launch and the end of communication. On the host clock (CPU) each
bucket's launch and finish are stamped too (a bucket done during backward reads as done at backward's end:
stamping on the communication thread instead costs a Python callback per bucket, ~1% of a ResNet50 iteration on
CPU). On CUDA a stamp is an event recorded on the current stream, resolved only when the numbers are asked for;
the events are created once and reused (two sets, alternating: the last iteration's stamps stay readable through
the next one), and per-bucket stamps are left to tracing, so the default adds no allocation, no event creation
and no host synchronization to an iteration: on a host-bound GPU every microsecond of the host's is on the
iteration, and a cost that grows with the number of buckets would bias a bucket-size sweep.
Tracing (``timing="trace"`` on the DDP) adds, per bucket, its launch and finish on every device, when its last
gradient arrived (ready; launch can be later, as buckets launch in order) and its true completion, stamped by a
callback on the communication thread (on events of its own: the callback may run late).
Derived fields follow torch's DDP logging data (``forward_compute_time``, ``backward_compute_time``,
``backward_comm_time``, ``backward_compute_comm_overlap_time``; comm starts when the first bucket is launched),
with ``_ms`` because ours are milliseconds, not torch's nanoseconds.
"""

from __future__ import annotations

import time

import torch


class HostClock:
    on_host = True

    def start_iteration(self) -> None:
        pass

    @staticmethod
    def stamp() -> float:
        return time.perf_counter()

    stamp_from_callback = stamp

    @staticmethod
    def ms(a, b) -> float:
        return (b - a) * 1e3


class EventClock:
    """Stamps as CUDA events from two reused sets (``make_event`` builds one: ``torch.cuda.Event`` with timing)."""

    on_host = False  # a stamp is an event on the stream: it lands after whatever was queued before it

    def __init__(self, make_event=lambda: torch.cuda.Event(enable_timing=True)):
        self._make_event = make_event
        self._sets: tuple[list, list] = ([], [])
        self._current, self._next = self._sets[1], 0

    def start_iteration(self) -> None:
        self._current = self._sets[0] if self._current is self._sets[1] else self._sets[1]
        self._next = 0

    def stamp(self):
        if self._next == len(self._current):  # only in the first iterations, or when tracing more buckets
            self._current.append(self._make_event())
        event = self._current[self._next]
        self._next += 1
        event.record()
        return event

    def stamp_from_callback(self):
        """A stamp from the communication thread, which may run late (after the next iteration began): a fresh
        event, so the reused sets stay the iteration thread's alone (tracing only)."""
        event = self._make_event()
        event.record()
        return event

    @staticmethod
    def ms(a, b) -> float:
        b.synchronize()
        return a.elapsed_time(b)


def clock_for(device: torch.device):
    return EventClock() if device.type == "cuda" else HostClock()


class IterationTiming:
    """Raw stamps of one synchronized iteration; ``as_dict()`` turns them into milliseconds."""

    __slots__ = (
        "clock",
        "per_bucket",
        "forward_start",
        "forward_end",
        "backward_start",
        "backward_end",
        "comm_end",
        "bucket_launch",
        "bucket_finish",
        "bucket_ready",
        "bucket_done",
    )

    def __init__(self, clock, num_buckets: int, trace: bool = False):
        self.clock = clock
        self.per_bucket = trace or clock.on_host  # launch and finish of every bucket, not only the first launch
        clock.start_iteration()
        self.forward_start = clock.stamp()
        self.forward_end = self.backward_start = self.backward_end = self.comm_end = None
        self.bucket_launch = [None] * num_buckets
        self.bucket_finish = [None] * num_buckets
        self.bucket_ready = [None] * num_buckets if trace else None  # last gradient in
        self.bucket_done = [None] * num_buckets if trace else None  # true completion (comm thread)

    def stamp_done(self, bucket: int):
        """A future callback that stamps ``bucket``'s completion when it happens."""

        def done(_future) -> None:
            self.bucket_done[bucket] = self.clock.stamp_from_callback()

        return done

    def as_dict(self) -> dict:
        ms = self.clock.ms
        t0 = self.forward_start
        rel = lambda s: None if s is None else ms(t0, s)  # noqa: E731
        launches = [rel(s) for s in self.bucket_launch]
        finishes = [rel(s) for s in self.bucket_finish]
        fwd_end, bwd_start, bwd_end, comm_end = (
            rel(s) for s in (self.forward_end, self.backward_start, self.backward_end, self.comm_end)
        )
        started = [x for x in launches if x is not None]
        comm_start = min(started) if started else bwd_end
        comm = comm_end - comm_start
        overlap = min(max(0.0, bwd_end - comm_start), comm)
        traced = (
            {}
            if self.bucket_ready is None
            else {
                "bucket_ready_ms": [rel(s) for s in self.bucket_ready],
                "bucket_done_ms": [rel(s) for s in self.bucket_done],
            }
        )
        return {
            **traced,
            "forward_compute_time_ms": fwd_end,
            "backward_compute_time_ms": bwd_end - bwd_start,
            "backward_comm_time_ms": comm,
            "backward_compute_comm_overlap_time_ms": overlap,
            "exposed_comm_time_ms": comm - overlap,
            "backward_start_ms": bwd_start,
            "backward_end_ms": bwd_end,
            "comm_end_ms": comm_end,
            "bucket_launch_ms": launches,
            "bucket_finish_ms": finishes,
        }
