"""ScheduleCheck: warn at the start of training about a schedule that cannot do what it says.

A run shorter than its statistics estimation (PHI-S A.7: the normalizers are never fitted on
the full estimate), than its frozen-trunk phase (the trunk never trains) or than its
learning-rate warm-up (the peak rate is never reached), or a run whose validation never comes
(no ``val/…`` metrics and no ``ModelCheckpoint`` monitor), is legal but almost always a
mistake in a shortened config. Each such problem is one warning naming the values.
"""

from __future__ import annotations

import logging
import math

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from radio_lit.callbacks.freeze import FreezeBody
from radio_lit.callbacks.statistics import TeacherStatsEstimation

logger = logging.getLogger(__name__)


def schedule_problems(trainer: pl.Trainer, warmup_steps: int = 0) -> list[str]:
    """What the schedule of ``trainer`` (its callbacks, ``max_steps``, validation settings)
    and a learning-rate warm-up of ``warmup_steps`` cannot do, one sentence each.

    Call it once the training data are loaded (``trainer.num_training_batches`` known).
    """
    problems = []
    max_steps = trainer.max_steps if trainer.max_steps is not None else -1
    if max_steps >= 0:
        phases: list[tuple[str, int, str]] = [("model.warmup_steps", warmup_steps, "warm-up")]
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, TeacherStatsEstimation):
                phases.append(
                    (f"{type(callback).__name__}.steps", callback.steps, "statistics estimation")
                )
            elif isinstance(callback, FreezeBody):
                phases.append((f"{type(callback).__name__}.steps", callback.steps, "frozen trunk"))
        for key, steps, what in phases:
            if steps > max_steps:
                problems.append(
                    f"trainer.max_steps={max_steps} ends before the {what} does ({key}={steps}): "
                    f"lower {key} or raise trainer.max_steps"
                )
    if trainer.limit_val_batches == 0 or not _has_validation(trainer):
        return problems
    if max_steps >= 0:
        first = _first_validation_step(trainer)
        if first is not None and first > max_steps:
            problems.append(
                f"validation first runs after {first} steps but trainer.max_steps={max_steps}: "
                "no val/ metrics will be logged; lower trainer.check_val_every_n_epoch or "
                "trainer.val_check_interval"
            )
    return problems


def _has_validation(trainer: pl.Trainer) -> bool:
    loop = trainer.fit_loop.epoch_loop.val_loop
    return bool(getattr(loop, "_data_source", None) and loop._data_source.is_defined())


def _first_validation_step(trainer: pl.Trainer) -> int | None:
    """Optimizer steps before the first validation (``None`` if it cannot be known)."""
    batches = trainer.num_training_batches
    if batches == float("inf") or batches == 0:
        return None
    accumulate = max(trainer.accumulate_grad_batches, 1)
    every_epoch = trainer.check_val_every_n_epoch
    interval = trainer.val_check_batch
    if every_epoch is None:  # validation every val_check_interval batches, across epochs
        return math.ceil(interval / accumulate)
    return math.ceil(((every_epoch - 1) * batches + interval) / accumulate)


class ScheduleCheck(Callback):
    """Log one warning (rank 0), when training starts, for each of :func:`schedule_problems`."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        warmup = int(getattr(pl_module, "warmup_steps", 0) or 0)
        for problem in schedule_problems(trainer, warmup):
            rank_zero_only(logger.warning)("warning: %s", problem)
