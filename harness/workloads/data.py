"""Real data for the convergence runs (paper Figure 11): load, split, standardize, shard across ranks.

Nothing is downloaded, ever:

* ``digits`` (default): scikit-learn's 8x8 handwritten digits (1797 samples, 64 features, 10 classes), which
  ships inside the scikit-learn package. A stratified, seeded split holds out ``test_fraction`` of it;
  features are standardized with the mean and std of the training split.
* ``cifar10``: CIFAR-10 read by ``torchvision.datasets.CIFAR10(data_dir, download=False)`` from a directory
  that already holds it (``<data_dir>/cifar-10-batches-py``); the official 10,000-image test batch is the
  held-out split. Images stay uint8 in memory and are normalized per channel when a batch is taken.

Sharding: every epoch is a fresh permutation of the training set, seeded by ``(seed, epoch)`` and so the same
on every rank; rank ``r`` of ``W`` takes ``perm[r::W]`` cut to ``N // W`` samples. The shards of one epoch are
disjoint and together cover all but ``N % W`` samples (a different few each epoch). A rank's batches are
consecutive slices of the concatenation of its shards, epoch after epoch (no partial batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

DATASETS = ("digits", "cifar10")
CIFAR_FOLDER = "cifar-10-batches-py"  # what torchvision.datasets.CIFAR10 reads under its root
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


@dataclass
class Dataset:
    """A train/test split held as tensors; ``inputs(x)`` turns stored samples into model inputs."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]

    @property
    def train_size(self) -> int:
        return len(self.y_train)

    @property
    def test_size(self) -> int:
        return len(self.y_test)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Float model inputs: identity for standardized features, per-channel normalization for images."""
        if x.dtype != torch.uint8:
            return x
        mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
        return (x.float() / 255.0 - mean) / std


def check_dataset(name: str, data_dir: str = "") -> None:
    """Raise ValueError unless ``name`` is known and its data is where it must be (cheap: runs before spawn)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {list(DATASETS)}")
    if name == "cifar10":
        if not data_dir:
            raise ValueError(
                "dataset='cifar10' needs data_dir=<directory holding cifar-10-batches-py>; nothing is downloaded"
            )
        folder = Path(data_dir) / CIFAR_FOLDER
        if not folder.is_dir():
            raise ValueError(
                f"CIFAR-10 not found: {folder} does not exist. Pass data_dir= a directory that already holds "
                f"torchvision's {CIFAR_FOLDER}/ (as torchvision's CIFAR10 dataset class leaves it after fetching it "
                "on a machine with internet access); this suite never downloads data"
            )


def load_dataset(name: str, data_dir: str = "", test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Load ``name`` into tensors (see the module docstring); ValueError for an unknown or missing data set."""
    check_dataset(name, data_dir)
    if name == "digits":
        return _digits(test_fraction, seed)
    return _cifar10(data_dir)


def _digits(test_fraction: float, seed: int) -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0)
    std[std == 0] = 1.0  # constant border pixels
    as_x = lambda a: torch.tensor((a - mean) / std, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.long)  # noqa: E731
    return Dataset("digits", as_x(x_tr), as_y(y_tr), as_x(x_te), as_y(y_te), num_classes=10, input_shape=(64,))


def _cifar10(data_dir: str) -> Dataset:
    from torchvision.datasets import CIFAR10

    try:
        train, test = (CIFAR10(data_dir, train=t, download=False) for t in (True, False))
    except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted"
        raise ValueError(f"CIFAR-10 under {data_dir!r} could not be read: {exc}") from exc
    as_x = lambda d: torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous()  # noqa: E731  NHWC -> NCHW uint8
    as_y = lambda d: torch.tensor(d.targets, dtype=torch.long)  # noqa: E731
    return Dataset("cifar10", as_x(train), as_y(train), as_x(test), as_y(test), num_classes=10, input_shape=(3, 32, 32))


def shard_indices(n: int, world_size: int, rank: int, epoch: int, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s training-sample indices for ``epoch``: ``perm[rank::world_size][: n // world_size]``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world_size {world_size}")
    if n < world_size:
        raise ValueError(f"{n} samples cannot be sharded over {world_size} ranks")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=gen)
    return perm[rank::world_size][: n // world_size]


def batch_indices(
    n: int, world_size: int, rank: int, batch_size: int, seed: int = 0
) -> Iterator[tuple[torch.Tensor, float]]:
    """Endless ``(indices, epoch)`` batches for one rank; ``epoch`` = fraction of epochs done when it starts."""
    per_rank = n // world_size
    epoch, pending = 0, torch.empty(0, dtype=torch.long)
    taken = 0  # samples this rank has consumed
    while True:
        while len(pending) < batch_size:
            pending = torch.cat([pending, shard_indices(n, world_size, rank, epoch, seed)])
            epoch += 1
        yield pending[:batch_size], taken / per_rank
        pending, taken = pending[batch_size:], taken + batch_size
