"""What a sweep has stored and stores: the points still pending, a dry run's plan, and each point's rows, written
once the last task that measures it is done (an anchor point is measured in several), atomically by
:func:`harness.results.write_point`, so a killed sweep resumes without loss or duplicates.
"""

from __future__ import annotations

import collections

import pandas as pd

from harness import results
from harness.config import PointConfig, config_columns


def pending_ids(experiment: str, ids: list[str], root, retry_errors: bool) -> set[str]:
    """The ``ids`` not stored yet; with ``retry_errors``, those stored as errors too."""
    stored = results.stored_point_ids(experiment, root)
    if retry_errors:
        stored -= results.failed_point_ids(experiment, root)
    return {pid for pid in ids if pid not in stored}


def print_plan(points: dict[str, PointConfig], pending: set[str]) -> pd.DataFrame:
    """A dry run: one row per point, stored or pending, with its config; printed and returned."""
    plan = pd.DataFrame(
        [
            {"point_id": pid, "status": "pending" if pid in pending else "stored", **config_columns(p)}
            for pid, p in points.items()
        ]
    )
    with pd.option_context("display.width", 200, "display.max_columns", 12):
        print(plan.to_string(index=False) if len(plan) else "no points")
    return plan


class PointStore:
    """Each point's rows gathered over the tasks that measure it (an anchor is in several) and stored once its last
    task is done: the tasks that worked, or the error if it failed in all. Only the writer (rank 0) stores."""

    def __init__(self, experiment: str, root, tasks: list[list[str]], order: list[str], writer: bool, on_stored):
        self.experiment, self.root, self.writer, self.on_stored = experiment, root, writer, on_stored
        self.positions = {pid: position for position, pid in enumerate(order)}
        self.tasks_left = collections.Counter(pid for task in tasks for pid in task)
        self.collected: dict[str, list[dict]] = collections.defaultdict(list)

    def add(self, task: list[str], measured: list[list[dict]], meta: dict) -> None:
        for pid, rows in zip(task, measured):
            self.collected[pid] += [{**meta, "run_position": self.positions[pid], **row} for row in rows]
            self.tasks_left[pid] -= 1
            if self.tasks_left[pid] == 0:
                rows = self.collected.pop(pid)
                fine = [row for row in rows if not row.get("error")]
                if self.writer:
                    results.write_point(self.experiment, pid, fine or rows[:1], self.root)
                self.on_stored()
