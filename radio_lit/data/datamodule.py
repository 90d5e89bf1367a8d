"""LightningDataModules yielding batches of crops: ``images [B, 3, S, S]`` uint8.

A batch is a plain uint8 tensor (4x less host-to-device traffic than float); the
LightningModule makes every model's view from it on the device (``views.py``). Training
batches hold one random-resized crop per image and are always full (``drop_last``);
validation batches hold a deterministic resize + center crop of each image of ``val_dir``.

Three sources share :class:`ImageDataModule`:

* :class:`ImageFolderDataModule`: a folder of images, or ``"radio_lit:sample_images"`` for
  the photographs shipped with the package;
* :class:`WebDatasetDataModule`: webdataset tar shards (DataComp / img2dataset layout);
* :class:`SyntheticDataModule`: deterministic synthetic images, for tests and smoke runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset

from radio_lit.data.image_folder import (
    ImageFolderDataset,
    check_decodable,
    list_images,
    resolve_image_root,
)
from radio_lit.data.resumable import ResumableDataLoader, SeededItems, SeededSampler
from radio_lit.data.shards import ImageShards, existing_shard_urls
from radio_lit.data.synthetic import SyntheticImages
from radio_lit.data.transforms import eval_transform, train_transform
from radio_lit.distributed.cluster import worker_ignores_stop_signals


class ImageDataModule(LightningDataModule):
    """Shared loading logic; subclasses only say how to build the training dataset.

    Args:
        crop_size: side ``S`` of every crop in a batch.
        batch_size: images per batch and per rank.
        num_workers: DataLoader worker processes (persistent when > 0).
        val_dir: optional folder of validation images (or ``"radio_lit:sample_images"``).
        seed: base seed of the training order, the crops and the workers' seeds.

    Training batches come from a torchdata ``StatefulDataLoader`` whose position Lightning
    checkpoints: a resumed run continues with the same next sample and the same crop. A rank
    whose step uses fewer than ``batch_size`` images (:meth:`use_rows`) loads only those.
    """

    #: Collates items into a batch (``None``: stack the ``[3, S, S]`` crops).
    collate: Callable[[list[Any]], Any] | None = None

    def __init__(
        self, crop_size: int, batch_size: int, num_workers: int, val_dir: str | None, seed: int = 0
    ) -> None:
        super().__init__()
        for option, value, least, meaning in (
            ("crop_size", crop_size, 1, "pixels per side of every crop"),
            ("batch_size", batch_size, 1, "images per batch and per rank"),
            ("num_workers", num_workers, 0, "DataLoader worker processes; 0: none"),
        ):
            if value < least:
                raise ValueError(
                    f"data.init_args.{option}: must be at least {least} ({meaning}), got "
                    f"{option}={value}"
                )
        if val_dir is not None:
            _check_image_folder(val_dir, "val_dir")
        self.crop_size = crop_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_dir = val_dir
        self.seed = seed
        #: images of each training batch this rank's step uses (``None``: all; use_rows)
        self.rows: int | None = None
        self.train_dataset: Dataset[Tensor] | None = None
        self.val_dataset: Dataset[Tensor] | None = None

    def build_train_dataset(self) -> Dataset[Tensor]:
        """The training dataset, items ``[3, S, S]`` uint8."""
        raise NotImplementedError

    def use_rows(self, rows: int | None) -> None:
        """This rank's step uses only the first ``rows`` images of each training batch
        (``None``: all of them), so only those are loaded and decoded.

        The model says so at its setup, once the run's ranks are known (a rank's partitions
        take ``rows`` images, radio_lit.training.partitions). The training batches are then
        ``[rows, 3, S, S]``: the first ``rows`` images, with their crops, of the batches of
        ``batch_size`` the rank would load otherwise, as many batches per epoch (every rank
        steps alike under DDP), resumed exactly (:class:`SeededSampler`'s used rows).
        """
        if rows is not None and not 0 < rows <= self.batch_size:
            raise ValueError(
                f"this rank's step uses {rows} images per batch but data.init_args.batch_size "
                f"is {self.batch_size}: set data.init_args.batch_size to at least {rows}"
            )
        self.rows = None if rows == self.batch_size else rows

    def build_val_dataset(self) -> Dataset[Any]:
        """The validation dataset (``val_dir`` is set): the center crops ``[3, S, S]`` uint8
        of ``val_dir``."""
        return ImageFolderDataset(str(self.val_dir), eval_transform(self.crop_size))

    def setup(self, stage: str) -> None:
        """Build the datasets ``stage`` needs (once; later calls keep them)."""
        if stage == "fit" and self.train_dataset is None:
            self.train_dataset = self.build_train_dataset()
        evaluates = stage in ("fit", "validate", "test", "predict")
        if evaluates and self.val_dir is not None and self.val_dataset is None:
            self.val_dataset = self.build_val_dataset()

    def train_dataloader(self) -> DataLoader[Tensor]:
        """Shuffled (map-style datasets) full batches ``[B, 3, S, S]`` uint8."""
        if self.train_dataset is None:
            raise RuntimeError("call setup('fit') before train_dataloader()")
        self._check_one_batch_per_rank(self.train_dataset)
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader[Tensor] | list[DataLoader[Tensor]]:
        """Batches ``[B, 3, S, S]`` uint8 of ``val_dir`` in order; ``[]`` without ``val_dir``."""
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader[Tensor]:
        """``radio-lit test`` and ``predict`` evaluate on the ``val_dir`` images."""
        if self.val_dataset is None:
            raise ValueError(
                "radio-lit test / predict read the held-out images of data.init_args.val_dir; "
                "set val_dir to a folder of images"
            )
        return self._loader(self.val_dataset, train=False)

    predict_dataloader = test_dataloader

    def _loader(self, dataset: Dataset[Tensor], train: bool) -> DataLoader[Tensor]:
        """Training: a resumable torchdata ``StatefulDataLoader`` (``resumable.py``); evaluation: a
        plain ordered DataLoader. Worker seeds come from a generator of their own, so
        creating a loader never draws from the global torch RNG that the step uses."""
        options: dict[str, Any] = dict(
            batch_size=(self.rows or self.batch_size) if train else self.batch_size,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator().manual_seed(self.seed),
            # the main process saves and ends its workers on a stop signal (Preemption)
            worker_init_fn=worker_ignores_stop_signals if self.num_workers > 0 else None,
        )
        if self.collate is not None:
            options["collate_fn"] = self.collate
        if not train:
            return DataLoader(dataset, **options)
        if isinstance(dataset, IterableDataset):
            return ResumableDataLoader(dataset, **options)
        trainer = self.trainer
        sampler = self.train_sampler(
            dataset,  # type: ignore[arg-type]
            num_replicas=trainer.world_size if trainer is not None else 1,
            rank=trainer.global_rank if trainer is not None else 0,
        )
        if self.rows is not None:
            sampler.use_rows(self.rows, self.batch_size)
        return ResumableDataLoader(self.seeded_items(dataset), sampler=sampler, **options)

    def train_sampler(self, dataset: Sized, num_replicas: int, rank: int) -> SeededSampler:
        """The training order: a :class:`SeededSampler` yielding ``(index, crop_seed)``."""
        return SeededSampler(dataset, num_replicas=num_replicas, rank=rank, seed=self.seed)

    def seeded_items(self, dataset: Dataset[Tensor]) -> Dataset[Any]:
        """The training dataset read with the sampler's keys (each crop under its seed)."""
        return SeededItems(dataset)

    def _check_one_batch_per_rank(self, dataset: Dataset[Tensor]) -> None:
        """Fail clearly when ``drop_last`` would leave a rank with no training batch."""
        if isinstance(dataset, IterableDataset) or not isinstance(dataset, Sized):
            return
        world_size = self.trainer.world_size if self.trainer is not None else 1
        if len(dataset) // world_size < self.batch_size:
            raise ValueError(
                f"the training set has {len(dataset)} images, fewer than batch_size="
                f"{self.batch_size} per rank on {world_size} rank(s): lower batch_size"
            )


class ImageFolderDataModule(ImageDataModule):
    """Crops of the images in a folder (searched recursively: jpg, jpeg, png, webp).

    Args:
        train_dir: folder of training images; ``"radio_lit:sample_images"`` is the folder of
            photographs shipped with the package.
        val_dir: optional folder of validation images (same convention).
        crop_size: side ``S`` of every crop.
        batch_size: images per batch and per rank.
        num_workers: DataLoader worker processes.
        scale: range of a training crop's area as a fraction of the image's area.
        repeats: passes over the folder per epoch, each with fresh random crops (for small
            folders, so an epoch is more than a handful of steps).
        seed: base seed of the shuffle and of each sample's crop, drawn from
            ``(seed, epoch, index)`` so a resumed run gets the same crops (``resumable.py``).
        reduced_decoding: decode a large JPEG at the smallest of libjpeg's DCT scales that
            keeps the training crop's box at least ``crop_size`` pixels a side (the same box;
            its pixels differ from a full decode's by resampling only; 2.7x faster per image
            for 2048 px photographs cropped to 384 px). ``false``: every image decoded in full.

    Unreadable files are skipped and counted (``ImageFolderDataset.num_skipped``).
    """

    def __init__(
        self,
        train_dir: str,
        val_dir: str | None = None,
        crop_size: int = 256,
        batch_size: int = 32,
        num_workers: int = 4,
        scale: tuple[float, float] = (0.35, 1.0),
        repeats: int = 1,
        seed: int = 0,
        reduced_decoding: bool = True,
    ) -> None:
        super().__init__(crop_size, batch_size, num_workers, val_dir, seed)
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        _check_image_folder(train_dir, "train_dir")
        self.train_dir = train_dir
        self.scale = scale
        self.repeats = repeats
        self.reduced_decoding = reduced_decoding

    def build_train_dataset(self) -> Dataset[Tensor]:
        transform = train_transform(
            self.crop_size, self.scale, reduced_decoding=self.reduced_decoding
        )
        folder = ImageFolderDataset(self.train_dir, transform)
        return folder if self.repeats == 1 else ConcatDataset([folder] * self.repeats)


class WebDatasetDataModule(ImageDataModule):
    """Crops of images streamed from resampled webdataset tar shards.

    Args:
        urls: shard url pattern or list of patterns, brace-expanded, e.g.
            ``"/data/datacomp/{00000..01023}.tar"``.
        samples_per_epoch: training samples per epoch **per rank** (rounded down to whole
            batches); shards are resampled with replacement, so this defines the epoch. A rank
            whose step uses ``rows`` of each batch (:meth:`use_rows`) reads ``rows`` per batch.
        crop_size: side ``S`` of every crop.
        batch_size: images per batch and per rank.
        num_workers: DataLoader worker processes.
        scale: range of a training crop's area as a fraction of the image's area.
        shuffle_buffer: encoded samples held in each worker's shuffle buffer.
        seed: base seed of shard resampling and shuffling (per rank, worker and epoch).
        val_dir: optional folder of validation images.
        reduced_decoding: decode a large JPEG at the smallest of libjpeg's DCT scales that
            keeps the training crop's box at least ``crop_size`` pixels a side (the same box;
            its pixels differ from a full decode's by resampling only; 2.7x faster per image
            for 2048 px photographs cropped to 384 px). ``false``: every image decoded in full.
    """

    def __init__(
        self,
        urls: str | list[str],
        samples_per_epoch: int,
        crop_size: int = 256,
        batch_size: int = 32,
        num_workers: int = 4,
        scale: tuple[float, float] = (0.35, 1.0),
        shuffle_buffer: int = 1000,
        seed: int = 0,
        val_dir: str | None = None,
        reduced_decoding: bool = True,
    ) -> None:
        super().__init__(crop_size, batch_size, num_workers, val_dir, seed)
        try:
            existing_shard_urls(urls)
        except (FileNotFoundError, ValueError) as error:
            raise FileNotFoundError(f"data.init_args.urls: {error}") from error
        self.urls = urls
        self.samples_per_epoch = samples_per_epoch
        self.scale = scale
        self.shuffle_buffer = shuffle_buffer
        self.reduced_decoding = reduced_decoding

    def build_train_dataset(self) -> ImageShards:
        """The shards, yielding ``samples_per_epoch // batch_size`` batches of ``rows`` crops
        (:meth:`use_rows`; default ``batch_size``) per epoch and rank."""
        rows = self.rows or self.batch_size
        return ImageShards(
            self.urls,
            train_transform(self.crop_size, self.scale, reduced_decoding=self.reduced_decoding),
            samples_per_epoch=self.samples_per_epoch // self.batch_size * rows,
            batch_size=rows,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
        )

    def use_rows(self, rows: int | None) -> None:
        """As :meth:`ImageDataModule.use_rows`: the shards, built at setup before the model
        knows its rows, are built again to yield batches of ``rows``."""
        before = self.rows
        super().use_rows(rows)
        if self.train_dataset is not None and self.rows != before:
            self.train_dataset = self.build_train_dataset()


class SyntheticDataModule(ImageDataModule):
    """Deterministic synthetic images already at the crop size (no files needed).

    Args:
        num_samples: training set size.
        crop_size: side ``S`` of every image.
        batch_size: images per batch and per rank.
        num_workers: DataLoader worker processes.
        seed: images depend only on ``(seed, index)``.
        val_dir: optional folder of validation images.
    """

    def __init__(
        self,
        num_samples: int = 64,
        crop_size: int = 64,
        batch_size: int = 8,
        num_workers: int = 0,
        seed: int = 0,
        val_dir: str | None = None,
    ) -> None:
        super().__init__(crop_size, batch_size, num_workers, val_dir, seed)
        self.num_samples = num_samples

    def build_train_dataset(self) -> SyntheticImages:
        return SyntheticImages(self.num_samples, self.crop_size, self.seed)


def _check_image_folder(root: str, option: str) -> None:
    """Fail at construction, naming ``data.init_args.<option>``, if ``root`` has no image or
    none that decodes (before any run folder is made, not at the first batch)."""
    try:
        check_decodable(list_images(root), resolve_image_root(root))
    except FileNotFoundError as error:
        raise FileNotFoundError(f"data.init_args.{option}: {error}") from error
    except ValueError as error:
        raise ValueError(f"data.init_args.{option}: {error}") from error
