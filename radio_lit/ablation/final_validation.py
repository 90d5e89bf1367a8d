"""FinalValidation: validate at the end of a run and save the metrics, for ``radio-lit ablate``.

An ablation row is compared with the others by its validation metrics after the last step
(PHI-S tables 3, 5, 18 are measured on the trained students). This callback makes sure the
validation loop runs at the last training step, whatever the base config's validation
schedule, and writes ``trainer.callback_metrics`` (the epoch-aggregated ``val/…`` values that
the loggers also receive) to a JSON file the runner reads. It can also write a small
progress file so the runner can show the step a running row has reached.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

__all__ = ["FinalValidation", "write_json"]


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as JSON atomically (a reader never sees a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False))
    os.replace(tmp, path)


class FinalValidation(Callback):
    """Run validation at the last training step and save its metrics.

    At the step that reaches ``trainer.max_steps`` the callback sets ``trainer.should_stop``;
    Lightning then runs the validation loop at that step (as for early stopping) before it
    ends the run. After every validation (sanity checks excepted) the ``val/…`` entries of
    ``trainer.callback_metrics`` are written to ``metrics_file`` as
    ``{"step": global_step, "metrics": {tag: value}}``. If the run ends without a validation at
    its last step (no ``val_dir``, or a ``check_val_every_n_epoch`` that skips the last
    epoch), ``on_train_end`` raises, so a row never reports stale metrics.

    Args:
        metrics_file: JSON file for the final validation metrics.
        progress_file: optional JSON file updated with ``{"step", "max_steps"}`` during
            training, at most every ``progress_every`` seconds.
        progress_every: seconds between progress updates.
        prefix: tags to save (``"val/"``).
    """

    def __init__(
        self,
        metrics_file: str,
        progress_file: str | None = None,
        progress_every: float = 2.0,
        prefix: str = "val/",
    ) -> None:
        self.metrics_file = Path(metrics_file)
        self.progress_file = None if progress_file is None else Path(progress_file)
        self.progress_every = progress_every
        self.prefix = prefix
        self._validated_step: int | None = None
        self._last_progress = 0.0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step, max_steps = trainer.global_step, trainer.max_steps
        if max_steps > 0 and step >= max_steps:
            trainer.should_stop = True  # Lightning validates at this step, then stops
        now = time.monotonic()
        if self.progress_file is not None and now - self._last_progress >= self.progress_every:
            write_json(self.progress_file, {"step": step, "max_steps": max_steps})
            self._last_progress = now

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {
            tag: float(value)
            for tag, value in trainer.callback_metrics.items()
            if tag.startswith(self.prefix)
        }
        if trainer.is_global_zero:
            write_json(self.metrics_file, {"step": trainer.global_step, "metrics": metrics})
        self._validated_step = trainer.global_step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._validated_step != trainer.global_step:
            raise RuntimeError(
                f"no validation ran at the last training step ({trainer.global_step}), so "
                f"{self.metrics_file} would not hold the final metrics: give the data module a "
                "val_dir (data.init_args.val_dir) and set trainer.check_val_every_n_epoch to 1 "
                "or null"
            )
