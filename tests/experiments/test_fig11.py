"""fig11's summary over seeds: means and ranges computed by hand from synthetic loss curves."""

import numpy as np
import pandas as pd

from experiments.figures import fig11_convergence as fig11


def _rows(seed: int, n: int, loss: float, early: float, acc: float, iters: int = 40) -> list[dict]:
    """Two ranks; the loss is ``early`` in the first 25% of iterations, ``loss`` from there on."""
    rows = []
    for rank in (0, 1):
        for it in range(iters):
            rows.append(
                dict(
                    dataset="digits",
                    world_size=2,
                    iters=iters,
                    lr=0.02,
                    momentum=0.9,
                    seed=seed,
                    batch_size=8,
                    sync_every=n,
                    iteration=it,
                    rank=rank,
                    error="",
                    loss=early if it < iters // 4 else loss,
                    test_accuracy=(acc if it == iters - 1 else 0.5) if rank == 0 and it % 10 == 9 else np.nan,
                )
            )
    return rows


def test_summary_gives_mean_and_range_over_seeds_and_pairs_ratios_by_seed():
    df = pd.DataFrame(
        _rows(0, 1, 0.10, 0.20, 0.90)
        + _rows(1, 1, 0.20, 0.40, 0.80)
        + _rows(0, 8, 0.05, 0.30, 0.92)
        + _rows(1, 8, 0.20, 0.40, 0.70)
    )
    cfg = fig11.Config(batch_sizes=(8,), sync_every=(1, 8), iters=40, seeds=(0, 1))
    final = fig11._final(fig11._selected(df, cfg), cfg)
    assert final.loc[(8, 8, 1), "acc"] == 0.70  # the last evaluation, not the earlier ones
    text = fig11.summarize(df, cfg)
    assert "2 seed(s)" in text
    assert "n=1: loss 0.1500 [0.1000, 0.2000], first 25% 0.300 [0.200, 0.400], test acc 85.0 [80.0, 90.0]%" in text
    # seed by seed: loss 0.5 and 1.0 (mean 0.75), early 1.5 and 1.0, accuracy +2 and -10 points
    assert "(loss x0.75 [0.50, 1.00], first 25% x1.25 [1.00, 1.50], acc -4.0 [-10.0, +2.0] pts)" in text


def test_one_seed_gives_no_range_and_unrequested_seeds_are_left_out():
    df = pd.DataFrame(_rows(0, 1, 0.10, 0.20, 0.90) + _rows(5, 1, 9.0, 9.0, 0.10))
    text = fig11.summarize(df, fig11.Config(batch_sizes=(8,), sync_every=(1,), iters=40, seeds=(0,)))
    assert "n=1: loss 0.1000, first 25% 0.200, test acc 90.0%" in text and "[" not in text.split("\n")[1]
