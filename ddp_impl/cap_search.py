"""``bucket_cap_mb="auto"``'s search: the DDP finds its bucket cap during the first iterations of training.

The paper finds that the cap decides up to 2x of an iteration and that the best one depends on the model and the
network; torch's DDP leaves it at 25 MiB. Ours measures instead:

1. The first ``WARMUP_ITERS`` synchronized iterations run at the default cap (the first records the gradient order,
   the second is the first on the rebuilt buckets); they are not measured.
2. Then each synchronized iteration is a trial of one candidate cap: the buckets are laid out again (in the observed
   gradient order, between iterations, with no communication) and the time from this forward to the next
   synchronized one is taken. A round tries every candidate still in the race once, in an order rotated each round,
   so that load drifting over the machine moves every candidate alike (paired rounds, as the suite measures).
3. At the end of a round one small allreduce takes, per trial, the slowest rank's time: every rank then holds the
   same numbers, so every rank makes the same decisions without a further message.
4. Every stage has a control: the default cap, or in a fine stage the cap the coarse one chose. From ``MIN_ROUNDS``
   rounds on, after each round, a candidate other than the control leaves the race when the percentile-bootstrap
   interval of its median over the leader's (pairs resampled together, the suite's paired statistics) lies above 1;
   the stage ends when the leader is resolved faster than the control, when only the control is left, or when the
   next round would pass the budget of iterations. So rounds get cheaper as candidates leave, and the iterations
   left go to the caps still close: a gain of a few percent needs more than three samples to resolve.
5. Without a prior the search is coarse-to-fine: a coarse stage over :data:`COARSE_MB`, then, if it chose a cap
   other than the default and the budget has room, a fine stage between that cap and the geometric midpoints to its
   coarse neighbours. A prior (caps ordered by a model's predicted latency, best first, e.g. the suite's simulator
   calibrated on this machine) replaces both with one stage over its first caps and the default.
6. A stage chooses its leader only when it is resolved faster than the control over at least ``CHOICE_ROUNDS``
   rounds at ``CHOICE_LEVEL``; otherwise the control stays. The trials, the choice and its reason are in ``log`` and
   ``result``. Once settled the tuner is dropped: no cost per iteration remains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .options import DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_CAP_MB, MIB

COARSE_MB = (1.0, 5.0, float(DEFAULT_BUCKET_CAP_MB), 100.0)  # fig7's sweep without its extremes
WARMUP_ITERS = 2
MIN_ROUNDS = 3  # samples per candidate before any is judged
BUDGET_ITERS = 30  # settled by this synchronized iteration, warm-up included
PRIOR_CAPS = 2  # a prior's best-predicted caps tried, beside the default
N_BOOT, LEVEL = 2000, 0.95
# A cap is chosen over the control only from this many paired rounds and at this level: with three rounds a
# candidate faster in all three by chance alone (one in eight) reads as resolved, and a stage looks after every round
CHOICE_ROUNDS, CHOICE_LEVEL = 5, 0.99


def ratio_interval(a: Sequence[float], b: Sequence[float], seed: int = 0, level: float = LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(a) / median(b) over paired samples (pairs resampled together).
    Seeded: every rank computes the same interval from the same agreed times."""
    a_t, b_t = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(a), (N_BOOT, len(a)), generator=gen)
    ratios = a_t[idx].quantile(0.5, dim=1) / b_t[idx].quantile(0.5, dim=1)
    tail = (1 - level) / 2
    lo, hi = torch.quantile(ratios, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return lo, hi


def _median(x: Sequence[float]) -> float:
    return float(torch.tensor(x, dtype=torch.float64).quantile(0.5))


def distinct_caps(caps_mb: Sequence[float], model_bytes: int) -> list[float]:
    """``caps_mb`` sorted, without repeats and without caps that lay out the same buckets: every cap at or above the
    model's gradient bytes gives one bucket, so of those only the smallest is kept, and the default (its first bucket
    of 1 MiB makes it another layout when the model is larger than that)."""
    caps = sorted({float(c) for c in caps_mb})
    below = [c for c in caps if c * MIB < model_bytes]
    above = [c for c in caps if c * MIB >= model_bytes]
    one_bucket = [c for c in above if c != DEFAULT_BUCKET_CAP_MB][:1]
    if DEFAULT_BUCKET_CAP_MB in above:
        default_is_one_bucket = model_bytes <= DEFAULT_FIRST_BUCKET_CAP_MB * MIB
        return below + sorted({float(DEFAULT_BUCKET_CAP_MB), *([] if default_is_one_bucket else one_bucket)})
    return below + one_bucket


@dataclass
class Stage:
    """One race: the candidates still in it, the one a leader must be resolved faster than, and every candidate's
    agreed time per round (ms)."""

    name: str
    candidates: list[float]
    control: float
    times: dict[float, list[float]]
    rounds: int = 0

    def order(self) -> list[float]:
        """This round's trial order, rotated each round."""
        k = self.rounds % len(self.candidates)
        return self.candidates[k:] + self.candidates[:k]

    def median(self, cap: float) -> float:
        return _median(self.times[cap])

    def leader(self) -> float:
        return min(self.candidates, key=self.median)

    def versus(self, cap: float, other: float, level: float = LEVEL) -> tuple[float, float, float]:
        """(ratio of medians, lo, hi) of ``cap`` over ``other`` over the rounds both ran (a candidate that left the
        race ran the first ones)."""
        n = min(len(self.times[cap]), len(self.times[other]))
        a, b = self.times[cap][:n], self.times[other][:n]
        return (_median(a) / _median(b), *ratio_interval(a, b, level=level))


class AutoTuner:
    """The search of the module docstring. Call :meth:`on_forward` at every synchronized forward with the host clock
    in ms; it returns the cap to lay the buckets out at now, or None to keep the current layout.

    Args:
        model_bytes: the gradients' bytes (caps at or above it give one bucket).
        prior_mb: caps ordered by predicted latency, best first; ``None``: coarse-to-fine.
        agree: turns this rank's trial times of a round into the times every rank agrees on (an allreduce taking
            the maximum); the identity on one process.
        budget: settled by this synchronized iteration, warm-up included.
    """

    def __init__(
        self,
        model_bytes: int,
        agree: Callable[[list[float]], list[float]],
        prior_mb: Sequence[float] | None = None,
        budget: int = BUDGET_ITERS,
    ):
        self.model_bytes, self.agree, self.budget = model_bytes, agree, budget
        self.prior = None if prior_mb is None else [float(c) for c in prior_mb]
        self.iteration = 0  # synchronized forwards seen
        self.log: list[dict] = []  # every trial: iteration, stage, round, cap_mb, ms
        self.result: dict | None = None  # once settled: cap_mb, reason, iterations, settled_ms
        self.stage: Stage | None = None
        self._round: list[float] = []  # this round's caps, in trial order
        self._round_ms: list[float] = []
        self._trial_start: float | None = None
        self._coarse: list[float] = []
        self._finished: Stage | None = None  # the last stage that ended

    # ---- the per-iteration step ----------------------------------------------------------------------
    def on_forward(self, now_ms: float) -> float | None:
        """Called at each synchronized forward: ends the running trial, closes a finished round, and returns the cap
        of the trial starting now (or the settled cap, once :attr:`result` is set); None keeps the layout."""
        self.iteration += 1
        if self._trial_start is not None:
            self._round_ms.append(now_ms - self._trial_start)
            self._trial_start = None
        if self.iteration <= WARMUP_ITERS:
            return None
        if self.stage is None:
            self._begin(*self._first_stage())
        elif len(self._round_ms) == len(self._round):
            self._close_round()
        if self.result is not None:
            return self.result["cap_mb"]
        return self._round[len(self._round_ms)]

    def trial_started(self, now_ms: float) -> None:
        """The layout for the trial is in place: its time runs from now (a relayout's cost is not the cap's)."""
        self._trial_start = now_ms

    # ---- stages and rounds ------------------------------------------------------------------------------
    def _first_stage(self) -> tuple[str, list[float]]:
        if self.prior is not None:
            return "prior", distinct_caps([*self.prior[:PRIOR_CAPS], DEFAULT_BUCKET_CAP_MB], self.model_bytes)
        self._coarse = distinct_caps(COARSE_MB, self.model_bytes)
        return "coarse", self._coarse

    def _fits(self, trials: int) -> bool:
        """A round of ``trials`` ends before the budget: the settled cap's first iteration is at most ``budget``."""
        return self.iteration + trials <= self.budget

    def _begin(self, name: str, candidates: list[float], control: float = float(DEFAULT_BUCKET_CAP_MB)) -> None:
        if len(candidates) < 2 or not self._fits(MIN_ROUNDS * len(candidates)):
            self._settle(self.stage, "too few iterations left to resolve another stage" if self.stage else None)
            return
        self.stage = Stage(name, list(candidates), control, {c: [] for c in candidates})
        self._next_round()

    def _next_round(self) -> None:
        self._round, self._round_ms = self.stage.order(), []

    def _close_round(self) -> None:
        stage = self.stage
        agreed = self.agree(self._round_ms)
        first = self.iteration - len(self._round)  # the iteration of the round's first trial
        for j, (cap, ms) in enumerate(zip(self._round, agreed)):
            stage.times[cap].append(ms)
            self.log.append(dict(iteration=first + j, stage=stage.name, round=stage.rounds, cap_mb=cap, ms=ms))
        stage.rounds += 1
        decided = False
        if stage.rounds >= MIN_ROUNDS:
            self._eliminate(stage)
            decided = len(stage.candidates) == 1 or self._resolved(stage)[0] != stage.control
        if not decided and self._fits(len(stage.candidates)):
            self._next_round()
            return
        self._finished = stage
        chosen = self._resolved(stage)[0]
        if stage.name == "coarse" and chosen != stage.control:
            self._begin("fine", self._fine_candidates(chosen), control=chosen)  # refine only a region resolved faster
        else:
            self._settle(stage, None)

    def _eliminate(self, stage: Stage) -> None:
        """Candidates resolved slower than the leader leave the race, the control excepted (their times stay, for
        the final verdict)."""
        leader = stage.leader()
        stage.candidates = [
            c for c in stage.candidates if c in (leader, stage.control) or stage.versus(c, leader)[1] <= 1
        ]

    def _fine_candidates(self, chosen: float) -> list[float]:
        """The coarse stage's choice and the geometric midpoints to its coarse neighbours."""
        grid = self._coarse
        k = grid.index(chosen)
        mids = [math.sqrt(max(grid[j], 0.25) * max(chosen, 0.25)) for j in (k - 1, k + 1) if 0 <= j < len(grid)]
        return distinct_caps([chosen, *[round(m, 2) for m in mids]], self.model_bytes)

    def _resolved(self, stage: Stage) -> tuple[float, str]:
        """(cap, reason): the stage's leader if it is resolved faster than the stage's control, else the control."""
        control, leader = stage.control, stage.leader()
        if leader == control:
            return control, f"{control:g} MiB measured fastest ({stage.name} stage)"
        ratio, lo, hi = stage.versus(control, leader, CHOICE_LEVEL)
        versus = f"x{ratio:.3f} [{lo:.3f}, {hi:.3f}], {stage.name} stage"
        if lo > 1 and min(len(stage.times[leader]), len(stage.times[control])) >= CHOICE_ROUNDS:
            return leader, f"{leader:g} MiB resolved faster than {control:g} MiB ({versus})"
        return (
            control,
            f"{leader:g} MiB led but was not resolved faster than {control:g} MiB ({versus}): kept {control:g}",
        )

    def _settle(self, stage: Stage | None, why_stopped: str | None) -> None:
        """Choose the stage's leader if it is resolved faster than its control, else the control."""
        if stage is None:
            cap, reason = float(DEFAULT_BUCKET_CAP_MB), "nothing to tune: every candidate cap gives the same buckets"
        else:
            cap, reason = self._resolved(stage)
        if why_stopped:
            reason += f"; {why_stopped}"
        settled = None if stage is None or cap not in stage.times else stage.median(cap)
        self.result = dict(cap_mb=cap, reason=reason, iterations=self.iteration, settled_ms=settled)

    def stop(self, why: str) -> None:
        """Settle now, between synchronized iterations, on the last stage that ran :data:`MIN_ROUNDS` rounds (every
        rank stops at the same point); the running trial and an unfinished round are dropped."""
        stage = self.stage if self.stage is not None and self.stage.rounds >= MIN_ROUNDS else self._finished
        self._settle(stage, why)
        self.result["iterations"] = self.iteration + 1  # the settled cap's first synchronized iteration
        if stage is None:
            self.result["reason"] = f"the default {DEFAULT_BUCKET_CAP_MB:g} MiB: tuning {why} before a stage ended"
