"""How a failed launch is told: one :class:`LaunchError` for all its ranks, led by the rank that failed first.

A rank that died takes the blame before what its peers saw of its death (a connection reset, a timeout), so the
error names the cause, not a symptom; spawned ranks (:mod:`harness.launch.pool`) and ranks run in place
(:mod:`harness.launch.spawn`) both fail through :func:`launch_error`.
"""

from __future__ import annotations

import signal
from typing import Sequence

CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL)


class LaunchError(RuntimeError):
    """A rank raised, died, or hung. ``failed_rank`` failed first and ``cause`` says how (its signal, exit code,
    or its exception's last line); the message starts with them, then holds each failed rank's traceback or why
    it failed. ``crashed``: the ranks a crash signal ended (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL), a fault
    inside native code."""

    def __init__(self, message: str, crashed: Sequence[int] = (), failed_rank: int | None = None, cause: str = ""):
        super().__init__(message)
        self.crashed = tuple(crashed)
        self.failed_rank, self.cause = failed_rank, cause


def exit_cause(exitcode: int) -> str:
    """How a process ended, in words: its signal's name, or its exit code."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def root_cause(errors: dict[int, str], died: dict[int, int], stuck: Sequence[int] = ()) -> tuple[int | None, str]:
    """(the rank that failed first, how): a rank that died is the cause, before what its peers saw of it (a
    connection reset, a timeout); otherwise the first rank to report (``errors`` in the order reported); otherwise
    no rank, when the ranks were only ``stuck`` (still running at a deadline: the parent's observation)."""
    if died:
        rank = next(iter(died))
        return rank, exit_cause(died[rank])
    reported = [r for r in errors if r not in stuck]
    if reported:
        return reported[0], _last_line(errors[reported[0]])
    why = _last_line(errors[stuck[0]]).removeprefix(f"rank {stuck[0]} still running")
    return None, f"rank(s) {sorted(stuck)} still running{why}"


def launch_error(
    errors: dict[int, str],
    world_size: int,
    backend: str,
    died: dict[int, int] | None = None,
    crashed: dict | None = None,
    stuck: Sequence[int] = (),
) -> LaunchError:
    """One error for the whole launch: the root cause first, then each failed rank's traceback or why it failed,
    then the ranks a crash signal ended (rank -> the signal's name)."""
    died, crashed = died or {}, crashed or {}
    failed_rank, cause = root_cause(errors, died, stuck)
    errors = {**{r: f"rank {r} {exit_cause(code)} without reporting a result" for r, code in died.items()}, **errors}
    detail = "\n".join(f"--- rank {r} ---\n{msg.rstrip()}" for r, msg in sorted(errors.items()))
    detail += "".join(f"\nrank {r} crashed ({name})" for r, name in crashed.items())
    first = "no rank failed" if failed_rank is None else f"rank {failed_rank} failed first"
    return LaunchError(
        f"{first}: {cause}\n{len(errors)} of {world_size} rank(s) failed ({backend}):\n{detail}",
        list(crashed),
        failed_rank,
        cause,
    )
