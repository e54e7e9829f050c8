"""Gradient bucket assignment: pure functions, testable without processes.

The paper packs gradients into flat buckets so one allreduce moves many small tensors. Parameters are taken in
the reverse of ``model.parameters()`` (roughly the order backward produces their gradients), split by (device,
dtype) because one flat buffer holds one kind of tensor, and a bucket is closed once it reaches its cap, so it
may exceed the cap by one tensor. The first bucket of each kind may get a smaller cap so the first ready gradients
do not wait long before their allreduce starts (torch's 1 MiB, which torch uses only with its default cap).
Before the first iteration has shown the gradient order, ``initial_buckets`` reproduces torch's own layout, so
per-bucket comparisons (and comm hooks keyed by bucket index) line up with torch's DDP in every iteration.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from .options import MIB


@dataclass(frozen=True)
class ParamSpec:
    """What bucketing needs to know about a parameter; lets tests bucket a model without running it."""

    name: str
    numel: int
    dtype: torch.dtype
    device: torch.device

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @classmethod
    def of(cls, name: str, param: torch.Tensor) -> "ParamSpec":
        return cls(name, param.numel(), param.dtype, param.device)


@dataclass(frozen=True)
class Bucket:
    """One flat buffer: the parameter indices it holds, in the order they lie in the buffer."""

    index: int
    param_indices: tuple[int, ...]
    names: tuple[str, ...]
    numel: int
    nbytes: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, index: int, members: list[int], specs: Sequence[ParamSpec]) -> "Bucket":
        """Bucket ``index`` holding the parameters ``members`` (indices into ``specs``), in that order."""
        first, numel = specs[members[0]], sum(specs[i].numel for i in members)
        names = tuple(specs[i].name for i in members)
        return cls(index, tuple(members), names, numel, numel * first.dtype.itemsize, first.dtype, first.device)

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "names": list(self.names),
            "numel": self.numel,
            "nbytes": self.nbytes,
            "dtype": str(self.dtype),
            "device": str(self.device),
        }


def mb_to_bytes(mb: float) -> int:
    """A cap in MiB as bytes; a finite cap too large for a float of bytes (> ~1e302 MiB) means one bucket, as
    any cap larger than the model does."""
    if not 0 <= mb < math.inf:
        raise ValueError(f"bucket caps must be finite and >= 0 MB, got {mb}")
    return int(min(mb * MIB, sys.maxsize))


def assign_buckets(
    specs: Sequence[ParamSpec],
    cap_bytes: int | Sequence[int],
    first_cap_bytes: int | None = None,
    order: Sequence[int] | None = None,
) -> list[Bucket]:
    """Group parameters into buckets, numbered in the order every rank launches them (the position of their first
    parameter in ``order``).

    Args:
        specs: the parameters, in registration order.
        cap_bytes: a bucket is closed once it holds this many bytes (so it may exceed it by one tensor); 0 gives one
            bucket per parameter, a cap larger than the model one bucket per (device, dtype). Or a list of caps
            (torch's ``bucket_cap_mb_list``): the k-th bucket of each kind closes at the k-th, the last repeating.
        first_cap_bytes: the first bucket's cap, if smaller (ignored with a list of caps).
        order: parameter indices in the order their gradients are expected (default: reverse registration order).

    Example::

        >>> specs = [ParamSpec.of(n, p) for n, p in model.named_parameters()]
        >>> [b.names for b in assign_buckets(specs, cap_bytes=mb_to_bytes(25), first_cap_bytes=mb_to_bytes(1))]
    """
    if isinstance(cap_bytes, int):
        limits = [cap_bytes if first_cap_bytes is None else min(first_cap_bytes, cap_bytes), cap_bytes]
    else:
        limits = list(cap_bytes)
    if not limits or min(limits) < 0 or (first_cap_bytes is not None and first_cap_bytes < 0):
        raise ValueError(f"bucket caps must be >= 0 bytes, got cap={cap_bytes}, first={first_cap_bytes}")
    if order is None:
        order = range(len(specs) - 1, -1, -1)
    order = list(order)
    if sorted(order) != list(range(len(specs))):
        raise ValueError("order must be a permutation of the parameter indices")

    groups = _fill_in_order(specs, limits, order)
    position = {p: k for k, p in enumerate(order)}
    groups.sort(key=lambda g: position[g[0]])
    return [Bucket.of(b, members, specs) for b, members in enumerate(groups)]


def _fill_in_order(specs: Sequence[ParamSpec], limits: list[int], order: list[int]) -> list[list[int]]:
    """Parameters taken in ``order`` into one open bucket per kind, each closed at its limit."""
    open_buckets: dict[tuple, list[int]] = {}
    open_bytes: dict[tuple, int] = {}
    closed_count: dict[tuple, int] = {}
    groups: list[list[int]] = []
    for i in order:
        key = (specs[i].device, specs[i].dtype)
        members = open_buckets.setdefault(key, [])
        members.append(i)
        open_bytes[key] = open_bytes.get(key, 0) + specs[i].nbytes
        limit = limits[min(closed_count.get(key, 0), len(limits) - 1)]
        if open_bytes[key] >= limit:
            groups.append(members)
            closed_count[key] = closed_count.get(key, 0) + 1
            del open_buckets[key], open_bytes[key]
    return groups + list(open_buckets.values())


def initial_buckets(
    specs: Sequence[ParamSpec], cap_bytes: int | Sequence[int], first_cap_bytes: int, find_unused_parameters: bool
) -> list[Bucket]:
    """torch's layout before any gradient order is known (torch 2.x).

    Without ``find_unused_parameters`` torch puts every parameter of a kind in one bucket for the first
    iteration (registration order gives no reliable gradient order) and rebuilds after it. With it (where torch
    never rebuilds), or with a list of per-bucket caps, torch fills buckets in registration order (the first cap
    going to the bucket that holds the first parameters) and then reverses the list of buckets, so the
    last-registered parameters launch first.
    """
    if not find_unused_parameters and isinstance(cap_bytes, int):
        cap_bytes = first_cap_bytes = sys.maxsize
    ascending = assign_buckets(specs, cap_bytes, first_cap_bytes, order=range(len(specs)))
    return [replace(b, index=k) for k, b in enumerate(reversed(ascending))]
