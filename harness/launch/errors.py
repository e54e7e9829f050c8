"""Inputs a user gets wrong end as one readable line, not a traceback; real bugs keep theirs.

Everything a sweep checks before it starts a rank (values, combinations, the machine) runs inside
:func:`refusing`, which turns the ``ValueError`` naming the field, the value and the allowed ones into a
:class:`ConfigError`. Command lines run their body through :func:`command_line`, which prints that message as
``<prog>: error: <message>`` and exits with status 2, as argparse does for a malformed option.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Callable, Iterator


class ConfigError(ValueError):
    """An input refused before anything ran; the message names the field, the value and what is allowed."""


@contextlib.contextmanager
def refusing() -> Iterator[None]:
    """Inside, a ``ValueError`` is an input refused before anything ran: re-raised as :class:`ConfigError`."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def command_line(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status, or 2 after one ``<prog>: error: ...`` line on stderr if it refused an input.
    SIGTERM (``timeout``, ``kill``, ``scancel``) ends it as an exception would, so that its rank pools close and
    stop their ranks: the network-emulation helper runs in a session of its own, which the signal does not reach."""
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        return body()
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if main_thread:  # None: a handler not set from Python, which cannot be put back; the default then
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _exit_on_sigterm(signum, _frame) -> None:
    raise SystemExit(128 + signum)
