"""``radio-lit ablate``'s progress lines: row i of n, its step, elapsed time and time left."""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Progress", "RowState", "clock"]


def clock(seconds: float) -> str:
    """``m:ss``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}:{secs:02d}"


@dataclass
class RowState:
    """A running row as its progress file reports it."""

    name: str
    index: int  # 1-based place among the rows to run
    start: float  # time.monotonic() when it started
    step: int = 0
    max_steps: int = 0


class Progress:
    """Time left of an ablation whose rows run ``jobs`` at a time.

    A row's time comes from measured time per step: the finished rows' wall time (start-up
    and final validation included) over their steps. Before any row has finished, a running
    row's own rate since its first reported step is used, plus its start-up time for each
    row not started yet. The time left is the rows' seconds still to run (the running rows'
    rest, the waiting rows' whole) shared by the ``jobs`` running at once, and never less than
    the longest running row's rest.
    """

    def __init__(self, total: int, jobs: int = 1) -> None:
        self.total = total
        self.jobs = jobs
        self.start = time.monotonic()
        self.finished: list[tuple[float, int]] = []  # (seconds, steps) of the finished rows
        self._first: dict[int, tuple[float, int]] = {}  # row index -> (time, step) first seen

    def row_done(self, index: int, seconds: float, steps: int) -> None:
        self.finished.append((seconds, steps))
        self._first.pop(index, None)

    def _row_estimate(self, row: RowState, now: float) -> tuple[float, float] | None:
        """``(seconds left in row, seconds of a whole row)``, ``None`` before it is known."""
        elapsed = now - row.start
        if self.finished:
            per_step = sum(s for s, _ in self.finished) / max(sum(n for _, n in self.finished), 1)
            steps = row.max_steps if row.max_steps > 0 else self.finished[-1][1]
            return max(per_step * steps - elapsed, 0.0), per_step * steps
        if row.step <= 0 or row.max_steps <= 0:
            return None
        first = self._first.get(row.index)
        if first is None or row.step < first[1]:
            self._first[row.index] = (now, row.step)
            return None
        first_time, first_step = first
        if row.step == first_step:
            return None
        per_step = (now - first_time) / (row.step - first_step)
        start_up = max(elapsed - (now - first_time) - per_step * first_step, 0.0)
        return per_step * (row.max_steps - row.step), start_up + per_step * row.max_steps

    def seconds_left(self, running: list[RowState], waiting: int, now: float) -> float | None:
        """Estimated seconds until the last row is done, ``None`` before anything is known."""
        estimates = [self._row_estimate(row, now) for row in running]
        known = [e for e in estimates if e is not None]
        if not known:
            return None
        rests = [rest for rest, _ in known]
        whole = max(row for _, row in known)
        unknown = len(estimates) - len(known)  # running rows without an estimate yet
        total = sum(rests) + (waiting + unknown) * whole
        return max(max(rests), total / self.jobs)

    def line(self, row: RowState, running: list[RowState], waiting: int) -> str:
        """``[i/n] name: step s/m, row time in this row, elapsed, time left``."""
        now = time.monotonic()
        steps = f"step {row.step}/{row.max_steps}" if row.max_steps > 0 else f"step {row.step}"
        left = self.seconds_left(running, waiting, now)
        estimate = "time left not known yet" if left is None else f"about {clock(left)} left"
        if left is not None and left == 0.0:
            estimate = "finishing"
        return (
            f"[{row.index}/{self.total}] {row.name}: {steps}, {clock(now - row.start)} in this "
            f"row, {clock(now - self.start)} elapsed, {estimate}"
        )
