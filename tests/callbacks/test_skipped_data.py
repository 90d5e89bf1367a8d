"""SkippedData: unreadable training images are skipped, counted and logged as data/skipped."""

from __future__ import annotations

from radio_lit.callbacks import SkippedData
from radio_lit.data import ImageFolderDataModule
from tests.builders import cpu_trainer, tiny_module
from tests.data.conftest import encoded_image


def test_corrupt_images_are_skipped_and_logged(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for index in range(6):
        (folder / f"{index}.jpg").write_bytes(encoded_image(index, size=64))
    (folder / "2.jpg").write_bytes(encoded_image(2, size=64)[:100])  # truncated
    (folder / "4.jpg").write_text("not an image")
    data = ImageFolderDataModule(str(folder), crop_size=64, batch_size=3, num_workers=2)
    trainer = cpu_trainer(tmp_path, max_steps=2, log_every_n_steps=1, callbacks=[SkippedData()])
    trainer.fit(tiny_module(), datamodule=data)
    # one epoch (2 batches of 3) reads all six files: both bad ones are found, once each
    assert trainer.callback_metrics["data/skipped"].item() == 2.0
    assert {p.name for p in data.train_dataset.bad_paths} == {"2.jpg", "4.jpg"}
