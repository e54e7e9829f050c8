"""Figure 11: convergence when gradients are synchronized only every n = 1, 2, 4, 8 iterations (paper Section 5.3).

    make fig11                                  CPU default: digits, Gloo, 2 ranks, 3 seeds x 8 points (~6 min)
    make fig11 ARGS="--batch_sizes=8 --sync_every=1,8 --iters=800"
    python -m experiments fig11 --dataset=cifar10 --data_dir=/data/cifar --iters=4000   (GPU advised)
    torchrun --nproc-per-node=2 -m experiments fig11 --world_size=2

Training loss (top; mean over ranks, smoothed over ``smooth`` iterations) and held-out test accuracy (bottom;
rank 0, every ``eval_every`` iterations) vs iteration, one line per n, one column per per-rank batch size. An
iteration is one forward/backward of one per-rank batch; with n > 1 the first n-1 of every n run inside our
DDP's ``no_sync()`` and the optimizer steps once per n iterations on the summed gradients (plain gradient
accumulation: the loss is not divided by n, the learning rate is not changed). Data: scikit-learn's digits
(shipped with the package, 80/20 split, standardized), or CIFAR-10 from ``--data_dir`` (never downloaded);
model: a 64-128-10 MLP (digits) or a small CNN (CIFAR-10); SGD with momentum. The defaults (lr 0.02,
momentum 0.9, 1600 iterations) were chosen on digits, where every (batch, n) converges well within them;
CIFAR-10 needs its own ``lr``/``iters``. ``iters`` should be a multiple of every n. Each (batch size, n) runs
once per seed (model init, split and shuffles; default 3 seeds): the curves are the mean over seeds with the
range shaded, and every number in the summary carries its range over seeds, so an effect smaller than what a
different seed does is not read as one. A point is 10-20 s on 2 CPU cores, about half of it starting the two
ranks (~6 min for the 24 points).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddp_impl import DEFAULT_BUCKET_CAP_MB
from experiments import common, plotting
from harness import ConvergenceConfig

FIGURE = "fig11"
PAPER = {
    "setup": "loss vs iterations, synchronizing every n = 1, 2, 4, 8 iterations, per-process batch 8 and 256 "
    "(batch sizes [likely])",
    "claim": "skipping synchronization does not noticeably slow convergence at small batch (8); at large batch "
    "(256) it can",
}


@dataclass(frozen=True)
class Config:
    """Convergence sweep over batch sizes and n; every field is a --key=value override."""

    dataset: str = "digits"  # digits | cifar10 (needs data_dir)
    data_dir: str = ""  # cifar10: directory holding cifar-10-batches-py
    world_size: int = 2  # ranks
    backend: str = "auto"  # gloo | nccl | mpi | auto (nccl where CUDA is)
    batch_sizes: tuple[int, ...] = (8, 256)  # examples per rank and iteration, a run each
    sync_every: tuple[int, ...] = (1, 2, 4, 8)  # n: synchronize 1 of every n iterations, accumulate otherwise
    iters: int = 1600  # forward/backward iterations per rank and run
    lr: float = 0.02  # SGD learning rate
    momentum: float = 0.9  # SGD momentum, in [0, 1)
    eval_every: int = 40  # rank 0 evaluates the test split every eval_every-th iteration
    seeds: tuple[int, ...] = (0, 1, 2)  # one run per seed; summaries give the range over seeds
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB  # DDP bucket cap (MiB)
    smooth: int = 50  # plot: rolling-mean window of the training loss, in iterations


def points(cfg: Config) -> list[ConvergenceConfig]:
    if cfg.smooth < 1:
        raise ValueError(f"smooth={cfg.smooth}: the loss's rolling window needs at least 1 iteration")
    return [
        ConvergenceConfig(
            dataset=cfg.dataset,
            data_dir=cfg.data_dir,
            world_size=cfg.world_size,
            backend=cfg.backend,
            batch_size=b,
            sync_every=n,
            iters=cfg.iters,
            lr=cfg.lr,
            momentum=cfg.momentum,
            eval_every=cfg.eval_every,
            seed=seed,
            bucket_cap_mb=cfg.bucket_cap_mb,
        )
        for seed in cfg.seeds
        for b in cfg.batch_sizes
        for n in cfg.sync_every
    ]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, synced_only=False)  # every iteration's loss counts, synchronized or not
    if ok.empty or "dataset" not in ok.columns:
        return ok.iloc[0:0]
    keep = (
        (ok["dataset"] == cfg.dataset)
        & (ok["world_size"] == cfg.world_size)
        & (ok["iters"] == cfg.iters)
        & (ok["lr"] == cfg.lr)
        & (ok["momentum"] == cfg.momentum)
        & ok["seed"].isin(cfg.seeds)
        & ok["batch_size"].isin(cfg.batch_sizes)
        & ok["sync_every"].isin(cfg.sync_every)
    )
    return ok[keep]


def loss_curves(ok, smooth: int):
    """(batch_size, sync_every) -> training loss, iteration x seed: mean over ranks, then a rolling mean."""
    mean = ok.groupby(["batch_size", "sync_every", "seed", "iteration"])["loss"].mean()
    return {
        key: s.droplevel([0, 1]).unstack("seed").rolling(max(1, smooth), min_periods=1).mean()
        for key, s in mean.groupby(level=[0, 1])
    }


def accuracy_curves(ok):
    """(batch_size, sync_every) -> test accuracy at the evaluated iterations (rank 0), iteration x seed."""
    ev = ok[ok["test_accuracy"].notna()]
    mean = ev.groupby(["batch_size", "sync_every", "seed", "iteration"])["test_accuracy"].mean()
    return {key: s.droplevel([0, 1]).unstack("seed") for key, s in mean.groupby(level=[0, 1])}


def _band(ax, curves, scale: float = 1.0, **style):
    """The mean over seeds as a line, their range shaded."""
    (line,) = ax.plot(curves.index + 1, scale * curves.mean(axis=1), **style)
    if curves.shape[1] > 1:
        ax.fill_between(
            curves.index + 1,
            scale * curves.min(axis=1),
            scale * curves.max(axis=1),
            color=line.get_color(),
            alpha=0.2,
            lw=0,
        )
    return line


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    fig, axes = plotting.grid(["train loss", "test accuracy"], [str(b) for b in cfg.batch_sizes], width=5.0, height=3.4)
    losses, accs = loss_curves(ok, cfg.smooth), accuracy_curves(ok)
    seeds = ok["seed"].nunique() if not ok.empty else 0
    over = f". Lines: the mean of {seeds} seeds, shaded: their range" if seeds > 1 else ". One seed"
    for c, batch in enumerate(cfg.batch_sizes):
        top, bottom = axes[0][c], axes[1][c]
        if not any(b == batch for b, _ in losses):
            plotting.mark_unavailable(top, f"no results for batch {batch}")
            plotting.mark_unavailable(bottom, f"no results for batch {batch}")
            continue
        for n in cfg.sync_every:
            if (batch, n) in losses:
                line = _band(top, losses[batch, n], lw=1.2, label=f"n = {n}")
                if (batch, n) in accs:
                    _band(
                        bottom, accs[batch, n], 100, marker=".", ms=3, lw=1.0, color=line.get_color(), label=f"n = {n}"
                    )
        top.set_yscale("log")
        top.set_title(f"per-rank batch {batch}: training loss (smoothed over {cfg.smooth} it.)", fontsize=9)
        bottom.set_title(f"per-rank batch {batch}: test accuracy (rank 0)", fontsize=9)
        values = np.concatenate(
            [100 * a.to_numpy().ravel() for (b, _), a in accs.items() if b == batch] or [np.array([])]
        )
        values = values[~np.isnan(values)]
        if len(values):  # zoom on where the curves end up; the first evaluations may sit far below
            bottom.set_ylim(max(0.0, np.percentile(values, 10) - 5), min(100.5, values.max() + 1))
        for ax, ylabel in ((top, "cross-entropy loss"), (bottom, "test accuracy (%)")):
            ax.set_xlabel("iteration")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8, title="sync every", title_fontsize=8)
    return plotting.finish(
        fig,
        f"Figure 11: convergence with skipped synchronization ({cfg.dataset}, "
        f"{cfg.world_size} ranks, SGD lr {cfg.lr:g} momentum {cfg.momentum:g})",
        PAPER["claim"],
        ok,
        f"{over}. Paper setup: {PAPER['setup']}",
    )


def _final(ok, cfg: Config) -> pd.DataFrame:
    """Per (batch_size, sync_every, seed): mean training loss over the last 10% of iterations (``loss``), over
    the first 25% (``early``), and the last test accuracy (``acc``)."""
    tail_from = cfg.iters - max(1, cfg.iters // 10)
    early_to = max(1, cfg.iters // 4)
    keys = ["batch_size", "sync_every", "seed"]
    out = pd.DataFrame(
        {
            "loss": ok[ok["iteration"] >= tail_from].groupby(keys)["loss"].mean(),
            "early": ok[ok["iteration"] < early_to].groupby(keys)["loss"].mean(),
        }
    )
    ev = ok[ok["test_accuracy"].notna()]
    last = ev[ev.groupby(keys)["iteration"].transform("max") == ev["iteration"]]
    return out.join(last.groupby(keys)["test_accuracy"].mean().rename("acc"))


def _range(values, fmt: str, scale: float = 1.0) -> str:
    """Mean over seeds, with [min, max] when there are several."""
    v = scale * np.asarray(values, dtype=float)
    text = format(v.mean(), fmt)
    return text if len(v) < 2 else f"{text} [{format(v.min(), fmt)}, {format(v.max(), fmt)}]"


def summarize(df, cfg: Config) -> str:
    ok = _selected(df, cfg)
    if ok.empty:
        return "no results"
    final = _final(ok, cfg)
    seeds = final.index.get_level_values("seed").nunique()
    lines = [
        f"{cfg.dataset}, {cfg.world_size} ranks, {cfg.iters} iterations, {seeds} seed(s) (mean [min, max] over "
        "seeds): training loss over the last 10% of iterations, over the first 25%, final test accuracy; "
        "ratios and differences to n = 1 taken seed by seed"
    ]
    for batch in cfg.batch_sizes:
        if batch not in final.index.get_level_values(0):
            continue
        per_n = final.xs(batch)
        ref = per_n.xs(1) if 1 in per_n.index.get_level_values(0) else None
        parts = []
        for n in cfg.sync_every:
            if n not in per_n.index.get_level_values(0):
                continue
            f = per_n.xs(n)
            text = (
                f"n={n}: loss {_range(f['loss'], '.4f')}, first 25% {_range(f['early'], '.3f')}, "
                f"test acc {_range(f['acc'], '.1f', 100)}%"
            )
            if ref is not None and n != 1:
                both = f.index.intersection(ref.index)
                text += (
                    f" (loss x{_range(f.loc[both, 'loss'] / ref.loc[both, 'loss'], '.2f')}, first 25% "
                    f"x{_range(f.loc[both, 'early'] / ref.loc[both, 'early'], '.2f')}, acc "
                    f"{_range(f.loc[both, 'acc'] - ref.loc[both, 'acc'], '+.1f', 100)} pts)"
                )
            parts.append(text)
        lines.append(f"batch {batch}: " + "; ".join(parts))
    return "\n".join(lines)
