"""SkippedData: how many unreadable training samples were skipped, for TensorBoard."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import ConcatDataset, Dataset


def num_skipped(dataset: Dataset | None) -> int | None:
    """Samples ``dataset`` skipped so far (corrupt images, truncated shards), across workers;
    ``None`` if it does not count them. A ``ConcatDataset`` of repeats counts each once."""
    if dataset is None:
        return None
    if isinstance(dataset, ConcatDataset):
        counts = {id(d): num_skipped(d) for d in dataset.datasets}
        known = [c for c in counts.values() if c is not None]
        return sum(known) if known else None
    count = getattr(dataset, "num_skipped", None)
    return int(count) if count is not None else None


class SkippedData(Callback):
    """Log ``data/skipped``: unreadable training samples skipped so far (on logging steps).

    The image folder and shard datasets skip a corrupt image or a truncated tar and go on
    (``ImageFolderDataset.num_skipped``, ``ImageShards.num_skipped``, shared by the
    DataLoader workers); this makes the count visible beside the losses.
    """

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        every = trainer.log_every_n_steps
        if every <= 0 or trainer.global_step % every:
            return
        count = num_skipped(getattr(trainer.datamodule, "train_dataset", None))
        if count is not None:
            # a host tensor: Lightning keeps it there (a float would be copied to the device)
            pl_module.log("data/skipped", torch.tensor(float(count)), on_step=True, on_epoch=False)
