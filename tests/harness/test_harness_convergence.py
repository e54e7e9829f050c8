"""Figure 11's convergence points: real data, per-rank shards, validation before spawn, and a real 2-rank run."""

import math
import pickle

import numpy as np
import pytest
import torch

import harness.sweep as sweep
from harness import ConvergenceConfig, TrainConfig, point_id, validate
from harness.workloads.convergence import build_convergence_model
from harness.workloads.data import CIFAR_FOLDER, batch_indices, load_dataset, shard_indices


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_digits_split_is_standardized_stratified_and_seeded(digits):
    assert (digits.train_size, digits.test_size) == (1437, 360) and digits.input_shape == (64,)
    assert digits.x_train.dtype == torch.float32 and digits.y_train.dtype == torch.long
    assert digits.x_train.mean().abs() < 1e-5 and abs(float(digits.x_train.std()) - 1) < 0.1
    counts = torch.bincount(digits.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified: ~36 of each digit held out
    again, other = load_dataset("digits"), load_dataset("digits", seed=1)
    assert torch.equal(again.x_test, digits.x_test) and not torch.equal(other.y_test, digits.y_test)


@pytest.mark.parametrize("n, world_size", [(1437, 2), (1437, 3), (100, 4), (10, 1)])
def test_shards_of_an_epoch_are_disjoint_and_complete(n, world_size):
    for epoch in (0, 1):
        shards = [shard_indices(n, world_size, r, epoch, seed=3) for r in range(world_size)]
        everything = torch.cat(shards)
        assert all(len(s) == n // world_size for s in shards)
        assert len(set(everything.tolist())) == len(everything) == n - n % world_size  # disjoint
        assert set(everything.tolist()) <= set(range(n))
    # deterministic per (seed, epoch) on every rank, reshuffled between epochs
    assert torch.equal(shard_indices(n, world_size, 0, 5, seed=3), shard_indices(n, world_size, 0, 5, seed=3))
    if n > 10:
        assert not torch.equal(shard_indices(n, world_size, 0, 0), shard_indices(n, world_size, 0, 1))


def test_batches_walk_the_shards_epoch_after_epoch():
    n, ws, bs = 100, 2, 16  # 50 samples per rank: batches straddle epoch boundaries
    stream = batch_indices(n, ws, 1, bs, seed=7)
    batches = [next(stream) for _ in range(10)]
    assert all(len(idx) == bs for idx, _ in batches)
    flat = torch.cat([idx for idx, _ in batches]).tolist()
    expected = torch.cat([shard_indices(n, ws, 1, e, seed=7) for e in range(4)]).tolist()
    assert flat == expected[: len(flat)]
    assert [round(e, 2) for _, e in batches[:4]] == [0.0, 0.32, 0.64, 0.96]


def _fake_cifar(root, n_train=20, n_test=10):
    """torchvision's on-disk layout with random images (integrity checks are patched out by the caller)."""
    folder = root / CIFAR_FOLDER
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        batch = {
            "data": rng.integers(0, 256, (n_train // 5, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, n_train // 5).tolist(),
        }
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    test = {
        "data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8),
        "labels": rng.integers(0, 10, n_test).tolist(),
    }
    (folder / "test_batch").write_bytes(pickle.dumps(test))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))


def test_cifar10_is_read_from_its_directory_and_feeds_the_cnn(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    _fake_cifar(tmp_path)
    monkeypatch.setattr(cifar, "check_integrity", lambda *a, **k: True)
    data = load_dataset("cifar10", str(tmp_path))
    assert (data.train_size, data.test_size, data.input_shape) == (20, 10, (3, 32, 32))
    assert data.x_train.dtype == torch.uint8 and data.x_train.shape == (20, 3, 32, 32)
    x = data.inputs(data.x_train[:4])
    assert x.dtype == torch.float32 and -3 < float(x.min()) < 0 < float(x.max()) < 3
    assert build_convergence_model(data)(x).shape == (4, 10)


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("launch must not be reached")

    monkeypatch.setattr(sweep._Pools, "get_for", refuse)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(dataset="mnist"), "unknown dataset 'mnist'"),
        (dict(dataset="cifar10"), "needs data_dir"),
        (dict(dataset="cifar10", data_dir="/nonexistent/cifar"), "CIFAR-10 not found: /nonexistent/cifar/"),
        (dict(iters=0), "iters must be a positive finite number, got 0"),
        (dict(sync_every=0), "sync_every must be a positive finite number, got 0"),
        (dict(batch_size=0), "batch_size must be a positive finite number, got 0"),
        (dict(eval_every=0), "eval_every must be a positive finite number, got 0"),
        (dict(lr=0.0), "lr must be a positive finite number"),
        (dict(momentum=1.0), "momentum must be in"),
        (dict(test_fraction=1.0), "test_fraction must be in"),
    ],
)
def test_bad_convergence_configs_raise_before_spawning(no_launch, tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        sweep.run_sweep("bad", [ConvergenceConfig(), ConvergenceConfig(**kw)], root=tmp_path)
    assert not (tmp_path / "bad").exists()


def test_point_ids_cover_the_convergence_settings():
    base = ConvergenceConfig()
    assert validate(base).backend in ("gloo", "nccl")
    assert point_id(base) == point_id(ConvergenceConfig(timeout_s=5))
    assert (
        len(
            {
                point_id(base),
                point_id(ConvergenceConfig(sync_every=8)),
                point_id(ConvergenceConfig(batch_size=256)),
                point_id(ConvergenceConfig(lr=0.1)),
                point_id(TrainConfig()),
            }
        )
        == 5
    )


def test_two_rank_run_learns_digits_with_skipped_sync():
    cfg = ConvergenceConfig(
        batch_size=32, sync_every=2, iters=120, lr=0.05, eval_every=40, threads_per_rank=1, timeout_s=60
    )
    rows = sweep.run_point(cfg)
    assert len(rows) == 2 * 120 and {r["point_type"] for r in rows} == {"ConvergenceConfig"}
    by_rank = {rank: [r for r in rows if r["rank"] == rank] for rank in (0, 1)}
    for rank, mine in by_rank.items():
        assert [r["iteration"] for r in mine] == list(range(120))
        assert [r["synced"] for r in mine[:4]] == [False, True, False, True]
        assert all(math.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1 for r in mine)
        assert mine[-1]["epoch"] == pytest.approx(119 * 32 / (1437 // 2))
    evaluated = [r["iteration"] for r in by_rank[0] if not math.isnan(r["test_accuracy"])]
    assert evaluated == [39, 79, 119] and all(math.isnan(r["test_accuracy"]) for r in by_rank[1])
    losses = np.array([[r["loss"] for r in by_rank[k]] for k in (0, 1)]).mean(axis=0)
    assert losses[-20:].mean() < 0.1 * losses[:10].mean()  # training loss falls (starts near ln 10 = 2.3)
    final = by_rank[0][-1]
    assert final["test_accuracy"] > 0.9 and final["test_loss"] < 0.3  # chance is 0.10 (measured: 0.96, 0.13)
    assert final["num_params"] == 64 * 128 + 128 + 128 * 10 + 10 and final["test_size"] == 360
