"""Counting one iteration's FLOPs of a harness model, for a named cluster's compute where no profile measured it.

The model part prices compute from :data:`~simulator.model.flop_profiles.STORED_FLOPS` (the figures' models, counted
with this torch) and refuses a model it lacks: counting builds the model, and the model part imports nothing of the
harness. Here it is counted (:func:`count_flops`, ~12 s a model), stored (:func:`store_flop_profiles`, after a torch
or model change), or counted where needed for a cluster's calibration (:func:`counted_cluster_calibration`, what
``python -m experiments predict --cluster=NAME`` uses, for any model).
"""

from __future__ import annotations

import torch

from ddp_impl.reducer import hook_accumulators
from harness.workloads.models import InputSpec, build_model, compute_loss, input_spec, make_inputs

from ..model.calibration import Calibration
from ..model.clusters import MIDDLE, Cluster, Corner, cluster_calibration
from ..model.flop_profiles import FlopProfile, save_flop_profiles


def count_flops(model: str) -> FlopProfile:
    """Counted on one sample on this CPU and scaled to the paper profile's batch (every counted operation is linear
    in it)."""
    from torch.utils.flop_counter import FlopCounterMode

    spec = input_spec(model, "paper")
    torch.manual_seed(0)
    net = build_model(model)
    inputs = make_inputs(model, InputSpec(1, spec.image_size, spec.seq_len), torch.device("cpu"))
    counter = FlopCounterMode(display=False)

    def done() -> float:
        return float(sum(counter.get_flop_counts()["Global"].values()))

    ready: dict[int, float] = {}
    params = [p for p in net.parameters() if p.requires_grad]
    _accumulators, hooks = hook_accumulators(params, lambda i: lambda *_: ready.__setitem__(i, done()))
    with counter:
        loss = compute_loss(model, net, inputs)
        forward = done()
        loss.backward()
        total = done()
    for h in hooks:
        h.remove()
    b = spec.batch_size
    return FlopProfile(
        param_bytes=tuple(p.numel() * p.element_size() for p in params),
        ready_flops=tuple((ready.get(i, total) - forward) * b for i in range(len(params))),
        forward_flops=forward * b,
        backward_flops=(total - forward) * b,
        buffer_bytes=sum(t.numel() * t.element_size() for t in net.buffers()),
        batch=b,
    )


def store_flop_profiles(models=("resnet50", "bert-base")) -> None:
    """Write :data:`~simulator.model.flop_profiles.STORED_FLOPS` for ``models`` (``python -c "import
    simulator.probe.flops as f; f.store_flop_profiles()"`` after a torch or model change)."""
    save_flop_profiles({m: count_flops(m) for m in models})


def counted_cluster_calibration(
    name: "str | Cluster", model: str, backend: str, world_size: int, batch: int | None = None, at: Corner = MIDDLE
) -> Calibration:
    """:func:`~simulator.model.clusters.cluster_calibration` for any model the harness builds: FLOPs the stored
    profiles lack are counted."""
    return cluster_calibration(name, model, backend, world_size, batch, at, count=count_flops)
