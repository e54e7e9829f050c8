"""The claims chart: every number the drivers reproduce (their ``claims(df, cfg)``), with its spread over
repetitions, beside the paper's value where the paper gives one; one panel per kind of number, so that each axis
means one thing, and the same as a table. ``experiments.registry.draw_claims`` gathers the claims and saves it."""

from __future__ import annotations

import pandas as pd

from experiments import plotting, verdicts


def axis_label(claim: verdicts.Claim) -> str:
    """The x axis label of the claims chart's panel for ``claim``: efficiencies (100 = ideal) apart from speedups and
    savings (0 = none), and both apart from ratios."""
    if claim.unit != "%":
        return "ratio (x)"
    return "weak-scaling efficiency (%; 100 = ideal)" if "efficiency" in claim.what else "speedup or saving (%)"


def figure(found: list[verdicts.Claim], frames: list[pd.DataFrame]):
    """The chart of the claims ``found``, a panel per :func:`axis_label`, captioned with the setup of the rows
    ``frames`` they were computed from."""
    panels = {}  # x axis label -> its claims: one axis per kind of number, so each axis means one thing
    for c in found:
        panels.setdefault(axis_label(c), []).append(c)
    fig, axes = plotting.grid(list(panels), [""], width=8.0, height=[0.3 * len(rows) + 0.9 for rows in panels.values()])
    for ax, (xlabel, rows) in zip(axes[:, 0], panels.items()):
        _panel(ax, xlabel, rows)
    return plotting.finish(
        fig,
        "Measured here vs the paper",
        "red diamonds (claims of a shape only have none)",
        pd.concat(frames, ignore_index=True),
    )


def _panel(ax, xlabel: str, rows: list[verdicts.Claim]) -> None:
    """One claim a row, the first on top: the measured interval, and the paper's value as a diamond."""
    ys = range(len(rows))
    m = [c.measured for c in rows]
    ax.errorbar(
        [x.center for x in m],
        ys,
        xerr=[[x.center - x.lo for x in m], [x.hi - x.center for x in m]],
        fmt="o",
        color="C0",
        capsize=3,
        label="measured here (95% interval over repetitions)",
    )
    paper = [(c.paper, y) for c, y in zip(rows, ys) if c.paper is not None]
    if paper:
        ax.plot(*zip(*paper), "D", color="C3", label="paper")
    ax.set_yticks(list(ys), [f"{c.figure}: {c.what}" for c in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first claim on top
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7)


def table(found: list[verdicts.Claim]) -> pd.DataFrame:
    """The claims as the command prints them: figure, what, the paper's value ('-' where none) and the measured."""
    return pd.DataFrame(
        [
            dict(
                figure=c.figure,
                what=c.what,
                paper="-" if c.paper is None else f"{c.paper:g}{c.unit}",
                measured=c.measured.fmt(c.unit, 2),
            )
            for c in found
        ]
    )
