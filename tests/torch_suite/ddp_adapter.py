"""Thin adapter: torch.nn.parallel.DistributedDataParallel's constructor in front of ddp_impl's DDP.

Maps what has an equivalent on a CPU/Gloo machine, ignores what is a no-op there, and raises
AdapterUnsupported (a NotImplementedError whose message starts with "adapter:") for the rest.
No torch-internal method (reducer API, _get_ddp_logging_data, ...) is provided:
calling one gives AttributeError, which the report counts as class (b).
"""

from __future__ import annotations

import torch
import torch.nn.parallel
import torch.nn.parallel.distributed as _tnd

from ddp_impl import DistributedDataParallel as _OurDDP

TorchDDP = _tnd.DistributedDataParallel  # the original, kept for reference


class AdapterUnsupported(NotImplementedError):
    pass


def _unsupported(what: str):
    raise AdapterUnsupported(f"adapter: torch DDP {what} has no equivalent in ddp_impl")


def _devices(module, device_ids, output_device) -> set:
    """The devices the module is on: ours runs the module where it is, so accept only device arguments that mean
    exactly that."""
    devices = {p.device for p in module.parameters()}
    if device_ids:
        if len(device_ids) > 1 or len(devices) != 1:
            _unsupported(f"device_ids={device_ids!r} (multi-device)")
        want = (
            torch.device(device_ids[0]) if not isinstance(device_ids[0], int) else torch.device("cuda", device_ids[0])
        )
        if want != next(iter(devices)):
            _unsupported(f"device_ids={device_ids!r} for a module on {next(iter(devices))}")
    if output_device is not None and not device_ids:
        _unsupported(f"output_device={output_device!r} without device_ids")
    return devices


def _refuse_unmapped(
    module, delay_all_reduce_named_params, param_to_hook_all_reduce, mixed_precision, skip_all_reduce_unused_params
) -> None:
    """Arguments with no equivalent in ours raise AdapterUnsupported rather than being silently ignored."""
    if delay_all_reduce_named_params is not None or param_to_hook_all_reduce is not None:
        _unsupported("delay_all_reduce_named_params/param_to_hook_all_reduce")
    if mixed_precision is not None:
        _unsupported("mixed_precision")
    if skip_all_reduce_unused_params:
        _unsupported("skip_all_reduce_unused_params=True")
    if getattr(module, "_ddp_params_and_buffers_to_ignore", None):
        _unsupported("params_and_buffers_to_ignore (module._ddp_params_and_buffers_to_ignore)")


def _mesh_group(device_mesh, process_group):
    """The process group to use: a 1-D device mesh maps to its group, with torch's own checks and messages."""
    if device_mesh is None:
        return process_group
    if process_group is not None:
        raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
    if device_mesh.ndim != 1:  # torch's own check and message
        raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
    return device_mesh.get_group(mesh_dim=0)


def _describe_as_torch(ddp, devices, device_ids, output_device, dim, gradient_as_bucket_view, device_mesh) -> None:
    """Plain public attributes torch's DDP has and that describe ours truthfully."""
    ddp.device_ids = None if not device_ids else list(device_ids)
    ddp.output_device = output_device
    ddp.dim = dim
    ddp.device = next(iter(devices))
    ddp.gradient_as_bucket_view = gradient_as_bucket_view
    if device_mesh is not None:
        ddp.device_mesh = device_mesh


class TorchDDPAdapter(_OurDDP):
    def __init__(
        self,
        module,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=None,
        init_sync=True,
        process_group=None,
        bucket_cap_mb=None,
        find_unused_parameters=False,
        check_reduction=False,
        gradient_as_bucket_view=False,
        static_graph=False,
        delay_all_reduce_named_params=None,
        param_to_hook_all_reduce=None,
        mixed_precision=None,
        device_mesh=None,
        skip_all_reduce_unused_params=False,
        bucket_cap_mb_list=None,
        batched_grad_copy=False,
        forward_sync_buffers=None,
    ):
        devices = _devices(module, device_ids, output_device)
        _refuse_unmapped(
            module,
            delay_all_reduce_named_params,
            param_to_hook_all_reduce,
            mixed_precision,
            skip_all_reduce_unused_params,
        )
        # check_reduction: deprecated no-op in torch; batched_grad_copy: a copy-kernel choice; dim: scatter only.
        super().__init__(
            module,
            process_group=_mesh_group(device_mesh, process_group),
            bucket_cap_mb=bucket_cap_mb,
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=broadcast_buffers,
            forward_sync_buffers=forward_sync_buffers,
            init_sync=init_sync,
            bucket_cap_mb_list=bucket_cap_mb_list,
            gradient_as_bucket_view=gradient_as_bucket_view,
            static_graph=static_graph,
        )
        _describe_as_torch(self, devices, device_ids, output_device, dim, gradient_as_bucket_view, device_mesh)


def install(*modules) -> None:
    """Replace torch's DDP by the adapter in torch.nn.parallel, torch.nn.parallel.distributed, and each
    module given (e.g. distributed_test, which did ``from torch.nn.parallel import DistributedDataParallel``)."""
    torch.nn.parallel.DistributedDataParallel = TorchDDPAdapter
    _tnd.DistributedDataParallel = TorchDDPAdapter
    for m in modules:
        if getattr(m, "DistributedDataParallel", None) is not None:
            m.DistributedDataParallel = TorchDDPAdapter
