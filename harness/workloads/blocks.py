"""A model's blocks (elements of an ``nn.Sequential`` or ``nn.ModuleList`` holding parameters, outermost first:
ResNet's bottlenecks, BERT's layers), the unit FSDP shards and activation checkpointing recomputes.
"""

from __future__ import annotations

from torch import nn


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's blocks (see the module docstring), outermost first, none inside another."""
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(module, (nn.Sequential, nn.ModuleList)) and any(True for _ in child.parameters()):
                found.append(child)
            else:
                visit(child)

    visit(model)
    return found


class Checkpointed(nn.Module):
    """A block whose activations are recomputed in backward instead of stored (non-reentrant checkpointing)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module) -> None:
    """Put every block (:func:`blocks`) behind :class:`Checkpointed`, in place."""
    targets = {id(b) for b in blocks(model)}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                parent._modules[name] = Checkpointed(child)
