"""Training from a teacher-feature cache: :class:`CachedViews` replays the cached views.

``data: radio_lit.cache.CachedViews`` (``path:`` the folder ``radio-lit cache`` wrote) yields
:class:`~radio_lit.cache.CachedBatch` batches: the uint8 crops the student sees and every
teacher's recorded outputs, which the step uses instead of running the teachers
(:func:`radio_lit.step.teacher_outputs`). The order is the live run's (the same
:class:`~radio_lit.data.resumable.SeededSampler` over the same items, same seed), and epoch
``e`` replays view ``e mod views`` of each item: the view a live run draws in epoch ``e``
for ``e < views``. So, with a float32 cache, a run from the cache is the live run, step for
step; checkpoints and exact resume work as for live data. Validation replays the cached
views of the run's ``val_dir`` (:class:`CachedValidation`): the teachers are not needed, and
the ``radio-lit`` command does not build them (:class:`~radio_lit.cache.CachedTeacher`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor
from torch.utils.data import Dataset
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from radio_lit.cache.batch import collate_views
from radio_lit.cache.manifest import VAL_FILE, Manifest, check_run, epoch_order
from radio_lit.cache.shards import ShardReader
from radio_lit.data.datamodule import ImageDataModule
from radio_lit.data.resumable import SeededSampler
from radio_lit.errors import ConfigError

__all__ = ["CachedDataset", "CachedValidation", "CachedViews", "ViewSampler"]


class CachedDataset(Dataset[Mapping[str, Tensor]]):
    """The cached views of a cache folder; item ``(index, view)`` is ``{"pixels": [3, S, S]
    uint8, "<teacher>/<H>x<W>/features": [h, w, C], "<teacher>/<H>x<W>/summary": [C_s]}``.

    Args:
        folder: the cache folder.
        manifest: its manifest.
    """

    def __init__(self, folder: str | Path, manifest: Manifest) -> None:
        self.manifest = manifest
        shards = [len(manifest.shard_samples(j)) for j in range(manifest.num_shards)]
        fix = (
            f"run radio-lit cache again with the same --config and --out {folder} "
            "(it keeps the finished shards)"
        )
        self.reader = ShardReader(Path(folder), shards, fix)
        self._positions: dict[int, Tensor] = {}  # view -> each item's place in its epoch

    def __len__(self) -> int:
        return self.manifest.num_items

    def __getitem__(self, key: tuple[int, int]) -> Mapping[str, Tensor]:
        index, view = key
        count = self.manifest.num_items
        if not (0 <= index < count and 0 <= view < self.manifest.views):
            raise IndexError(f"no cached view {view} of item {index}")
        if view not in self._positions:
            order = torch.tensor(epoch_order(count, int(self.manifest.data["seed"]), view))
            self._positions[view] = torch.argsort(order)
        sample = view * count + int(self._positions[view][index])
        return self.reader.read(*divmod(sample, self.manifest.samples_per_shard))


class CachedValidation(Dataset[Mapping[str, Tensor]]):
    """The cached validation views of a cache folder (:data:`VAL_FILE`), in ``val_dir``
    order; item ``i`` is keyed like :class:`CachedDataset`'s."""

    def __init__(self, folder: str | Path, manifest: Manifest) -> None:
        path = Path(folder) / VAL_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"cache validation views {path} are missing: run radio-lit cache again with "
                f"the same --config and --out {folder} (it keeps the finished shards)"
            )
        self.tensors = load_file(str(path))
        if len(self.tensors["pixels"]) != manifest.val_items:
            raise ValueError(
                f"cache validation views {path} hold {len(self.tensors['pixels'])} images, the "
                f"manifest {manifest.val_items}: run radio-lit cache again into a new --out"
            )

    def __len__(self) -> int:
        return len(self.tensors["pixels"])

    def __getitem__(self, index: int) -> Mapping[str, Tensor]:
        return {key: value[index] for key, value in self.tensors.items()}


class ViewSampler(SeededSampler):
    """The live run's order (:class:`SeededSampler`, same seed), yielding ``(index, view)``
    with ``view = epoch mod views``."""

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, seed: int, views: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, seed=seed)
        self.views = views

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        for index in StatefulDistributedSampler.__iter__(self):
            yield index, self.epoch % self.views


class CachedViews(ImageDataModule):
    """Training batches read from a teacher-feature cache (see the module docstring).

    Args:
        path: the folder ``radio-lit cache --out`` wrote.
        batch_size: images per batch and per rank; ``None``: the cached run's.
        num_workers: DataLoader worker processes reading the shards.

    The crop size, the seed of the order and the validation images (``val_dir``) are the
    cached run's. At ``fit`` the model's teachers and student resolutions are checked
    against the manifest (:func:`radio_lit.cache.manifest.check_run`).
    """

    collate = staticmethod(collate_views)

    def __init__(self, path: str, batch_size: int | None = None, num_workers: int = 0) -> None:
        manifest = Manifest.load(path)
        super().__init__(
            crop_size=int(manifest.data["crop_size"]),
            batch_size=batch_size or int(manifest.data["batch_size"]),
            num_workers=num_workers,
            val_dir=None,
            seed=int(manifest.data["seed"]),
        )
        self.val_dir = manifest.data["val_dir"] if manifest.val_items else None
        self.path = path
        self.manifest = manifest
        self.train_data = CachedDataset(path, manifest)  # refuses missing or truncated shards
        self.val_data = CachedValidation(path, manifest) if manifest.val_items else None

    def setup(self, stage: str) -> None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        if stage == "fit" and module is not None:
            try:
                check_run(
                    self.manifest,
                    self.path,
                    module.teachers,
                    module.partitions,
                    module.student.patch_size,
                )
            except ValueError as error:
                raise ConfigError(f"data.init_args.path: {error}") from error
        super().setup(stage)

    def build_train_dataset(self) -> CachedDataset:
        return self.train_data

    def build_val_dataset(self) -> CachedValidation:
        assert self.val_data is not None  # val_dir is set only when the cache has views of it
        return self.val_data

    def train_sampler(self, dataset: Sized, num_replicas: int, rank: int) -> SeededSampler:
        return ViewSampler(dataset, num_replicas, rank, self.seed, self.manifest.views)

    def seeded_items(self, dataset: Dataset[Any]) -> Dataset[Any]:
        return dataset  # keyed by (index, view) already
