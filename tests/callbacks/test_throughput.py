"""ImagesPerSecond counts the images every rank's partitions use (AM-RADIO 4, PHI-S 3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radio_lit.callbacks import ImagesPerSecond, throughput
from radio_lit.partitions import Partition
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
