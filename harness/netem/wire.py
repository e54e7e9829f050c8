"""How requests and results travel between :class:`harness.netem.shaping.NamespacePool` and its helper inside the
namespace: as JSON lines, never pickled, so the helper runs only what it imports by name. ``fn`` goes by import name,
its arguments as plain values and dataclasses; per-rank results come back as JSON (tuples come back as lists)."""

from __future__ import annotations

import dataclasses
import importlib


def encode(value):
    """``value`` as JSON can carry it, dataclasses and tuples marked so that :func:`decode` rebuilds them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {
            "__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("network emulation passes arguments as JSON: dict keys must be strings")
        return {k: encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"network emulation passes launch arguments as JSON; cannot send {type(value).__name__}")


def import_name(qualified: str):
    """The object ``"module:qualified.name"`` names."""
    module, _, name = qualified.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def decode(value):
    """What :func:`encode` wrote, as it was (dataclasses are imported by name)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if "__dataclass__" in value:
            return import_name(value["__dataclass__"])(**{k: decode(v) for k, v in value["fields"].items()})
        if "__tuple__" in value:
            return tuple(decode(v) for v in value["__tuple__"])
        return {k: decode(v) for k, v in value.items()}
    return value


def plain(value):
    """json.dump fallback for results: numpy/torch scalars become Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"rank result of type {type(value).__name__} is not JSON-serializable")
