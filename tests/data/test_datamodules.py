"""The datamodules as LightningCLI builds them and as the Trainer uses them."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningDataModule

from radio_lit.data import (
    SAMPLE_IMAGES,
    ImageFolderDataModule,
    SyntheticDataModule,
    WebDatasetDataModule,
    as_float_images,
    resize_view,
)
from tests.builders import cpu_trainer

QUICKSTART_DATA = """
data:
  class_path: radio_lit.data.ImageFolderDataModule
  init_args:
    train_dir: radio_lit:sample_images
    val_dir: radio_lit:sample_images
    crop_size: 64
    batch_size: 4
    num_workers: 0
    scale: [0.5, 1.0]
"""

SHARDS_DATA = """
data:
  class_path: radio_lit.data.WebDatasetDataModule
  init_args:
    urls:
      - {root}/datacomp/{{00000..00003}}.tar
      - {root}/extra/{{000..001}}.tar
    samples_per_epoch: 100000
    shuffle_buffer: 5000
"""


def build(yaml: str) -> LightningDataModule:
    parser = ArgumentParser()
    parser.add_subclass_arguments(LightningDataModule, "data")
    return parser.instantiate_classes(parser.parse_string(yaml)).data


def test_yaml_configs_build_typed_datamodules(tmp_path) -> None:
    folder = build(QUICKSTART_DATA)
    assert isinstance(folder, ImageFolderDataModule)
    assert folder.train_dir == SAMPLE_IMAGES and folder.scale == (0.5, 1.0)
    for name in ("datacomp/00000", "datacomp/00001", "datacomp/00002", "datacomp/00003"):
        (tmp_path / f"{name}.tar").parent.mkdir(exist_ok=True)
        (tmp_path / f"{name}.tar").touch()
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra/000.tar").touch()
    with pytest.raises(ValueError, match=r"1 of 6 shards do not exist, e\.g\. .*extra/001\.tar"):
        build(SHARDS_DATA.format(root=tmp_path))  # checked when built, not mid-run
    (tmp_path / "extra/001.tar").touch()
    shards = build(SHARDS_DATA.format(root=tmp_path))
    assert isinstance(shards, WebDatasetDataModule)
    assert shards.urls == [
        f"{tmp_path}/datacomp/{{00000..00003}}.tar",
        f"{tmp_path}/extra/{{000..001}}.tar",
    ]
    assert shards.crop_size == 256 and shards.batch_size == 32


def test_a_training_set_smaller_than_a_batch_fails_clearly() -> None:
    datamodule = ImageFolderDataModule(SAMPLE_IMAGES, batch_size=32, num_workers=0)
    datamodule.setup("fit")
    with pytest.raises(ValueError, match="fewer than batch_size=32"):
        datamodule.train_dataloader()


def test_reduced_decoding_reaches_the_training_crops() -> None:
    """``data.init_args.reduced_decoding`` sets how the training crops decode their images."""
    for reduced in (True, False):
        datamodule = ImageFolderDataModule(SAMPLE_IMAGES, reduced_decoding=reduced, num_workers=0)
        datamodule.setup("fit")
        assert datamodule.train_dataset.transform.reduced_decoding is reduced


def test_invalid_loader_settings_fail_clearly() -> None:
    with pytest.raises(ValueError, match="crop_size"):
        SyntheticDataModule(crop_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        SyntheticDataModule(num_workers=-1)


class RecordBatches(pl.LightningModule):
    """Checks the batch contract and records batch counts; learns one scalar."""

    def __init__(self, crop_size: int) -> None:
        super().__init__()
        self.crop_size = crop_size
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.train_batches = 0
        self.val_batches = 0

    def check(self, batch: torch.Tensor) -> torch.Tensor:
        assert type(batch) is torch.Tensor
        assert batch.dtype == torch.uint8 and batch.shape[1:] == (3, self.crop_size, self.crop_size)
        view = resize_view(as_float_images(batch), 8)
        return (view.mean() - self.weight) ** 2

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.train_batches += 1
        return self.check(batch)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.val_batches += 1
        self.check(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(datamodule: LightningDataModule, crop_size: int) -> RecordBatches:
    module = RecordBatches(crop_size)
    trainer = cpu_trainer(None, max_steps=-1, max_epochs=2)
    trainer.fit(module, datamodule=datamodule)
    return module


def test_the_trainer_fits_on_the_sample_photographs_with_validation() -> None:
    datamodule = build(QUICKSTART_DATA)
    module = fit(datamodule, crop_size=64)
    photos = len(datamodule.train_dataset)
    assert module.train_batches == 2 * (photos // 4)
    assert module.val_batches == 2 * -(-photos // 4)


def test_the_trainer_fits_without_validation_data() -> None:
    module = fit(SyntheticDataModule(num_samples=12, crop_size=16, batch_size=4), crop_size=16)
    assert module.train_batches == 6
    assert module.val_batches == 0


def test_the_trainer_runs_fixed_epochs_on_shards(shard_dir) -> None:
    datamodule = WebDatasetDataModule(
        str(shard_dir / "{00000..00002}.tar"),
        samples_per_epoch=12,
        crop_size=16,
        batch_size=4,
        num_workers=0,
        shuffle_buffer=8,
    )
    module = fit(datamodule, crop_size=16)
    assert module.train_batches == 6
