"""Faults injected on purpose (a point's ``fault="<kind>@<rank>"``, ``harness.config.FAULT_KINDS``), so tests can
check that every way a rank fails ends its launch with an error instead of a hang."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time

FAULT_DELAY_S = 1.0  # kill / linkdown strike this long after the point starts: mid-run, not before it


def inject_fault(fault: str, rank: int) -> None:
    """Test hook (``"<kind>@<rank>"``): make ``rank`` raise, exit without reporting, crash (``segv``) or hang now;
    or, from a timer while it trains, SIGKILL itself (``kill``) or take its emulated host's link down
    (``linkdown``: ``ip link set <its Gloo interface> down``, inside the emulated network's namespace)."""
    if not fault:
        return
    kind, _, target = fault.partition("@")
    if int(target) != rank:
        return
    if kind in ("kill", "linkdown"):
        threading.Timer(FAULT_DELAY_S, _fault_mid_run, (kind,)).start()
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "exit":
        os._exit(3)
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        while True:
            time.sleep(3600)


def _fault_mid_run(kind: str) -> None:
    """The timer's fault, while the rank trains: SIGKILL this process, or take down the interface Gloo uses."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    subprocess.run(
        [shutil.which("ip") or "/usr/sbin/ip", "link", "set", interface, "down"],
        check=False,
        capture_output=True,
        timeout=30,
    )
