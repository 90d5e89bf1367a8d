"""ImagesPerSecond counts the images every rank's partitions use (AM-RADIO 4, PHI-S 3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.pytorch import Callback

from radio_lit.callbacks import ImagesPerSecond, throughput
from radio_lit.training.partitions import Partition
from tests.builders import cpu_trainer, image_batches, tiny_module


@pytest.mark.parametrize(
    ("partitions", "images"),
    [
        (None, 4),  # one partition: the whole batch of 4
        (
            {
                "a": Partition(teachers=["clip", "dino"], batch_size=2),
                "b": Partition(teachers=["sam"], batch_size=1),
            },
            3,
        ),
        ({"a": Partition(teachers=["clip", "dino", "sam"], batch_size=2)}, 2),
    ],
)
def test_images_per_second_counts_the_images_the_partitions_use(
    partitions, images, tmp_path, monkeypatch
) -> None:
    clock = iter([0.0, 2.0, 4.0, 6.0])  # the end of each training batch: 2 s apart
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=clock.__next__))
    trainer = cpu_trainer(tmp_path, max_steps=2, callbacks=[ImagesPerSecond()])
    trainer.fit(tiny_module(partitions=partitions), image_batches(num_images=8, batch_size=4))
    assert trainer.callback_metrics["train/images_per_sec"].item() == images / 2.0


class RecordThroughput(Callback):
    """``train/images_per_sec`` after each training batch (``None`` before the first log)."""

    def __init__(self) -> None:
        self.values: list[float | None] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        value = trainer.callback_metrics.get("train/images_per_sec")
        self.values.append(None if value is None else value.item())


def test_each_logged_value_is_the_throughput_since_the_previous_one(tmp_path, monkeypatch):
    """Five steps of 4 images, logged every 2 steps (and at the last): batch ends at 0, 1, 3,
    6 and 10 s give 4 / 1 s at step 1, 8 images / 5 s at step 3, 4 / 4 s at step 4."""
    clock = iter([0.0, 1.0, 3.0, 6.0, 10.0])
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=clock.__next__))
    record = RecordThroughput()
    trainer = cpu_trainer(
        tmp_path, max_steps=5, log_every_n_steps=2, callbacks=[ImagesPerSecond(), record]
    )
    trainer.fit(tiny_module(), image_batches(num_images=20, batch_size=4))
    assert record.values == [None, 4.0, 4.0, pytest.approx(1.6), 1.0]
