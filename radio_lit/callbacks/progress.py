"""LineProgress: training progress as periodic one-line logs, for output that is not a terminal.

Lightning's TQDM bar redraws one line with carriage returns, which a log file or a batch
system's output keeps as an ever-growing line. When standard output is not a terminal,
``radio-lit`` uses this bar instead: one line every ``interval_s`` seconds (and at the last
step) with the step, the rate, the time left and the progress-bar metrics::

    step 120/300 (40%)  2.31 it/s  0:01:18 left  loss=0.412
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` of a non-negative number of seconds."""
    return str(timedelta(seconds=round(max(seconds, 0.0))))


class LineProgress(ProgressBar):
    """Print a progress line every ``interval_s`` seconds of training, and at its last step.

    The rate is measured over the steps since the previous line; the time left is
    ``(max_steps - step) / rate`` (``max_steps`` or the epochs' total batches).

    Args:
        interval_s: seconds between two lines.
    """

    def __init__(self, interval_s: float = 15.0) -> None:
        super().__init__()
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self._enabled = True
        self._last: tuple[float, int] | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.trainer.is_global_zero

    def total_steps(self, trainer: pl.Trainer) -> int | None:
        """The run's last optimizer step: ``max_steps``, else the epochs' batches."""
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return int(trainer.max_steps)
        batches, epochs = trainer.num_training_batches, trainer.max_epochs
        if epochs is None or epochs < 0 or batches == float("inf"):
            return None
        return int(batches) * int(epochs) // max(trainer.accumulate_grad_batches, 1)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = (time.monotonic(), trainer.global_step)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self.is_enabled or self._last is None:
            return
        now, step = time.monotonic(), trainer.global_step
        total = self.total_steps(trainer)
        last_time, last_step = self._last
        if now - last_time < self.interval_s and step != total:
            return
        self._last = (now, step)
        rate = (step - last_step) / max(now - last_time, 1e-9)
        parts = [f"step {step}" + (f"/{total} ({100 * step // total}%)" if total else "")]
        parts.append(f"{rate:.2f} it/s")
        if total and rate > 0:
            parts.append(f"{format_duration((total - step) / rate)} left")
        metrics = self.get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        parts += [
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
        ]
        sys.stdout.write("  ".join(parts) + "\n")
        sys.stdout.flush()
