"""ImagesPerSecond: training throughput for TensorBoard."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from radio_lit.callbacks._common import distillation_module
from radio_lit.metrics.logging import logs_this_step


class ImagesPerSecond(Callback):
    """Log ``train/images_per_sec``: the images all ranks used since the previous logged step
    over the wall time since then, measured between the ends of training batches (data
    loading, teachers, student and optimizer: what a researcher waits for). Logged on the
    steps the logger writes (:func:`~radio_lit.metrics.logging.logs_this_step`), so each point
    is the throughput of the whole stretch of steps it stands for, not of its last step.

    Lightning's ``ThroughputMonitor`` is not used because it counts rank 0's batch times the
    world size, which is wrong when partitions give ranks different numbers of images
    (AM-RADIO 4, PHI-S 3); here each rank's share comes from the partition plan.
    """

    def __init__(self) -> None:
        super().__init__()
        self._last: float | None = None
        self._images = 0
        self._seconds = 0.0
        self._step = -1  # the optimizer step after the last batch seen

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = None
        self._images, self._seconds = 0, 0.0

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        now = time.perf_counter()
        if self._last is not None:
            plan = distillation_module(pl_module).partitions
            # A rank's partitions take rank_batch_size images; None: the whole batch.
            per_rank = [plan.rank_batch_size(r) or len(batch) for r in range(trainer.world_size)]
            self._images += sum(per_rank)
            self._seconds += now - self._last
        self._last = now
        stepped, self._step = trainer.global_step != self._step, trainer.global_step
        if stepped and self._seconds > 0 and logs_this_step(trainer, trainer.global_step - 1):
            rate = torch.tensor(self._images / self._seconds)  # a host tensor: Lightning keeps
            pl_module.log("train/images_per_sec", rate, on_step=True)  # it there, no device sync
            self._images, self._seconds = 0, 0.0
