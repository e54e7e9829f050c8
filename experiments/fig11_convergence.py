"""Figure 11: convergence when gradients are synchronized only every n = 1, 2, 4, 8 iterations (paper Section 5.3).

    make fig11                                  CPU default: digits, Gloo, 2 ranks, 8 points (~2 min + setup)
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
CIFAR-10 needs its own ``lr``/``iters``. ``iters`` should be a multiple of every n. Each (batch size, n) is
one point of 10-20 s on 2 CPU cores, about half of it starting the two ranks (~2 min for all 8).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from experiments import common
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
    data_dir: str = ""
    world_size: int = 2
    backend: str = "auto"
    batch_sizes: tuple[int, ...] = (8, 256)  # per rank
    sync_every: tuple[int, ...] = (1, 2, 4, 8)
    iters: int = 1600
    lr: float = 0.02
    momentum: float = 0.9
    eval_every: int = 40
    seed: int = 0
    bucket_cap_mb: float = 25
    smooth: int = 50  # plot: rolling-mean window of the training loss, in iterations


def points(cfg: Config) -> list[ConvergenceConfig]:
    return [ConvergenceConfig(dataset=cfg.dataset, data_dir=cfg.data_dir, world_size=cfg.world_size,
                              backend=cfg.backend, batch_size=b, sync_every=n, iters=cfg.iters, lr=cfg.lr,
                              momentum=cfg.momentum, eval_every=cfg.eval_every, seed=cfg.seed,
                              bucket_cap_mb=cfg.bucket_cap_mb)
            for b in cfg.batch_sizes for n in cfg.sync_every]


def _selected(df, cfg: Config):
    ok = common.ok_rows(df, synced_only=False)  # every iteration's loss counts, synchronized or not
    if ok.empty or "dataset" not in ok.columns:
        return ok.iloc[0:0]
    keep = (ok["dataset"] == cfg.dataset) & (ok["world_size"] == cfg.world_size) & (ok["iters"] == cfg.iters) \
        & (ok["lr"] == cfg.lr) & (ok["momentum"] == cfg.momentum) & (ok["seed"] == cfg.seed) \
        & ok["batch_size"].isin(cfg.batch_sizes) & ok["sync_every"].isin(cfg.sync_every)
    return ok[keep]


def loss_curves(ok, smooth: int):
    """(batch_size, sync_every) -> training loss per iteration: mean over ranks, then a rolling mean."""
    mean = ok.groupby(["batch_size", "sync_every", "iteration"])["loss"].mean()
    return {key: s.droplevel([0, 1]).rolling(max(1, smooth), min_periods=1).mean()
            for key, s in mean.groupby(level=[0, 1])}


def accuracy_curves(ok):
    """(batch_size, sync_every) -> test accuracy at the evaluated iterations (rank 0)."""
    ev = ok[ok["test_accuracy"].notna()]
    return {key: s.droplevel([0, 1])
            for key, s in ev.groupby(["batch_size", "sync_every", "iteration"])["test_accuracy"].mean()
            .groupby(level=[0, 1])}


def plot(df, cfg: Config):
    ok = _selected(df, cfg)
    fig, axes = common.grid(["train loss", "test accuracy"], [str(b) for b in cfg.batch_sizes], width=5.0,
                            height=3.4)
    losses, accs = loss_curves(ok, cfg.smooth), accuracy_curves(ok)
    for c, batch in enumerate(cfg.batch_sizes):
        top, bottom = axes[0][c], axes[1][c]
        if not any(b == batch for b, _ in losses):
            common.mark_unavailable(top, f"no results for batch {batch}")
            common.mark_unavailable(bottom, f"no results for batch {batch}")
            continue
        for n in cfg.sync_every:
            if (batch, n) in losses:
                line, = top.plot(losses[batch, n].index + 1, losses[batch, n].values, lw=1.2, label=f"n = {n}")
                if (batch, n) in accs:
                    acc = accs[batch, n]
                    bottom.plot(acc.index + 1, 100 * acc.values, marker=".", ms=3, lw=1.0,
                                color=line.get_color(), label=f"n = {n}")
        top.set_yscale("log")
        top.set_title(f"per-rank batch {batch}: training loss (smoothed over {cfg.smooth} it.)", fontsize=9)
        bottom.set_title(f"per-rank batch {batch}: test accuracy (rank 0)", fontsize=9)
        values = np.concatenate([100 * a.values for (b, _), a in accs.items() if b == batch] or [np.array([])])
        if len(values):  # zoom on where the curves end up; the first evaluations may sit far below
            bottom.set_ylim(max(0.0, np.percentile(values, 10) - 5), min(100.5, values.max() + 1))
        for ax, ylabel in ((top, "cross-entropy loss"), (bottom, "test accuracy (%)")):
            ax.set_xlabel("iteration")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8, title="sync every", title_fontsize=8)
    return common.finish(fig, f"Figure 11: convergence with skipped synchronization ({cfg.dataset}, "
                              f"{cfg.world_size} ranks, SGD lr {cfg.lr:g} momentum {cfg.momentum:g})",
                         PAPER["claim"], ok, f". Paper setup: {PAPER['setup']}")


def _final(ok, cfg: Config):
    """(batch, n) -> (mean training loss over the last 10% of iterations, early loss, last test accuracy)."""
    out = {}
    tail_from = cfg.iters - max(1, cfg.iters // 10)
    early_to = max(1, cfg.iters // 4)
    accs = accuracy_curves(ok)
    for (batch, n), sel in ok.groupby(["batch_size", "sync_every"]):
        acc = accs.get((batch, n))
        out[batch, n] = (sel.loc[sel["iteration"] >= tail_from, "loss"].mean(),
                         sel.loc[sel["iteration"] < early_to, "loss"].mean(),
                         acc.iloc[-1] if acc is not None and len(acc) else np.nan)
    return out


def summarize(df, cfg: Config) -> str:
    ok = _selected(df, cfg)
    if ok.empty:
        return "no results"
    final = _final(ok, cfg)
    lines = [f"{cfg.dataset}, {cfg.world_size} ranks, {cfg.iters} iterations: training loss (mean of the last 10% "
             f"of iterations; first 25% in brackets) and final test accuracy, per n, vs n = 1"]
    for batch in cfg.batch_sizes:
        ref = final.get((batch, 1))
        parts = []
        for n in cfg.sync_every:
            if (batch, n) not in final:
                continue
            loss, early, acc = final[batch, n]
            text = f"n={n}: loss {loss:.4f} [{early:.3f}], test acc {100 * acc:.1f}%"
            if ref is not None and n != 1:
                text += f" (loss x{loss / ref[0]:.2f}, acc {100 * (acc - ref[2]):+.1f} pts)"
            parts.append(text)
        if parts:
            lines.append(f"batch {batch}: " + "; ".join(parts))
    return "\n".join(lines)
