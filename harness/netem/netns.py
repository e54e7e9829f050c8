"""Where a rank of an emulated host runs (:mod:`harness.netem.shaping`): its own network namespace, entered before any
socket opens, and the interface Gloo binds to there. The launcher only runs :meth:`Host.enter` in each rank."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000  # os.CLONE_NEWNET from Python 3.12


def enter_netns(path: str) -> None:
    """Move this thread (and the threads and processes it starts later) into the network namespace at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python >= 3.12
            os.setns(fd, os.CLONE_NEWNET)
        elif ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Host:
    """An emulated host as one of its ranks sees it: the network namespace at ``netns`` and its ``interface``."""

    netns: str
    interface: str

    def enter(self) -> None:
        """Run in the rank before any socket opens: into the host's namespace, Gloo bound to its interface."""
        enter_netns(self.netns)
        os.environ["GLOO_SOCKET_IFNAME"] = self.interface
