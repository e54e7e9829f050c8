"""What a forward returns: the tensors in a nested output, and the one autograd node they all pass through.

torch's DDP looks inside tensors, lists, tuples (named too), dicts (a transformers ModelOutput is one) and
dataclasses; so do we, to find the parameters an output reaches (``find_unused_parameters``) and to make every
output take part in backward (:class:`_OutputSink`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Iterator

import torch


def tensors_in(obj) -> Iterator[torch.Tensor]:
    """Every tensor in a nested output, as torch's DDP finds them: tensors, lists, tuples (named too), dicts
    (a transformers ModelOutput is one) and dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors_in(getattr(obj, f.name))


class _OutputSink(torch.autograd.Function):
    """Every output tensor through one node (torch's ``_DDPSink``): a backward from any of them then runs the
    branches of the others too, with no gradient (``None``, not zeros), so the hooks of parameters behind an
    output the loss left out still fire and the reducer counts those parameters unused on this rank instead of
    waiting for gradients that never come."""

    @staticmethod
    def forward(ctx, *tensors):
        ctx.set_materialize_grads(False)
        return tuple(t.clone() for t in tensors)  # clones, so the caller may modify an output in place

    @staticmethod
    def backward(ctx, *grads):
        return grads


def through_sink(output, tensors: list[torch.Tensor]):
    """``output`` with each of ``tensors`` replaced by its pass through one :class:`_OutputSink` node, and the
    new tensors."""
    sunk = _OutputSink.apply(*tensors)
    return _with_tensors(output, {id(t): s for t, s in zip(tensors, sunk)}), list(sunk)


def _with_tensors(obj, new: dict[int, torch.Tensor]):
    """A copy of a nested output with tensors replaced through ``new`` (by ``id``), walking what ``tensors_in``
    walks; containers are rebuilt as the same type (a frozen dataclass too), anything else kept as is."""
    if isinstance(obj, torch.Tensor):
        return new.get(id(obj), obj)
    if isinstance(obj, dict):
        copy_ = copy.copy(obj)  # keeps the type (a transformers ModelOutput, a defaultdict's factory)
        for k, v in obj.items():
            copy_[k] = _with_tensors(v, new)
        return copy_
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple
        return type(obj)(*(_with_tensors(v, new) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_with_tensors(v, new) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        copy_ = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(copy_, f.name, _with_tensors(getattr(obj, f.name), new))
        return copy_
    return obj


def unreached_parameters(outputs: list[torch.Tensor], params: list[torch.Tensor]) -> list[int]:
    """Indices of the ``params`` the autograd graph of ``outputs`` does not reach: they will get no gradient."""
    reached, seen = set(), set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    reached.update(id(t) for t in outputs if t.grad_fn is None)  # an output that is a parameter itself
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)
        if variable is not None:
            reached.add(id(variable))
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return [i for i, p in enumerate(params) if id(p) not in reached]
