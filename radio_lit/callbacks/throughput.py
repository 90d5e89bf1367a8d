"""ImagesPerSecond: training throughput for TensorBoard."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from radio_lit.callbacks._common import distillation_module


class ImagesPerSecond(Callback):
    """Log ``train/images_per_sec``: the images all ranks used in a step over the wall time
    between the ends of consecutive training batches (data loading, teachers, student and
    optimizer: what a researcher waits for).

    Lightning's ``ThroughputMonitor`` is not used because it counts rank 0's batch times the
    world size, which is wrong when partitions give ranks different numbers of images
    (AM-RADIO 4, PHI-S 3); here each rank's share comes from the partition plan.
    """

    def __init__(self) -> None:
        super().__init__()
        self._last: float | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = None

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
            pl_module.log("train/images_per_sec", sum(per_rank) / (now - self._last), on_step=True)
        self._last = now
