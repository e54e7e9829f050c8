"""Link rates written as tc writes them (``500mbit``, ``1.5gbit``) and the values a point's ``net`` may take.

Pure functions with no machine access, so a config is checked without touching the network; whether this
machine can emulate a network at all is :mod:`harness.preflight`'s question, how it does is
:mod:`harness.netem.shaping`'s.
"""

from __future__ import annotations

import re

_UNITS_MBIT = {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3, "tbit": 1e6}
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
NET_HELP = "'loopback', 'auto', or a rate per rank like '500mbit', '1gbit', '10gbit' (kbit, mbit, gbit, tbit)"


def parse_rate(text: str) -> float:
    """``'1.5gbit'`` -> 1500.0 (Mbit/s). tc's ``bps`` units mean *bytes*/s, so they are refused, not guessed."""
    m = _RATE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"unknown net {text!r}; choose {NET_HELP}")
    return float(m.group(1)) * _UNITS_MBIT[m.group(2).lower()]


def check_net(net: str) -> None:
    """Raise ValueError unless ``net`` is loopback, auto or a positive rate."""
    if net not in ("loopback", "auto"):
        parse_rate(net)
