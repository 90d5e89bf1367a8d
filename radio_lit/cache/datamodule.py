"""Training from a teacher-feature cache: :class:`CachedViews` replays the cached views.

``data: radio_lit.cache.CachedViews`` (``path:`` the folder ``radio-lit cache`` wrote) yields
:class:`~radio_lit.cache.CachedBatch` batches: the uint8 crops the student sees and every
teacher's recorded outputs, which the step uses instead of running the teachers
(:func:`radio_lit.training.teachers.teacher_outputs`). The order is the live run's (the same
:class:`~radio_lit.data.resumable.SeededSampler` over the same items, same seed), and epoch
``e`` replays view ``e mod views`` of each item: the view a live run draws in epoch ``e``
for ``e < views``. The teacher outputs read are those computed in this run's grouping (its
rank count, :mod:`radio_lit.cache.grouping`). So, with a float32 cache written for this
run's rank count and batch size, a run from the cache is the live run, step for step;
checkpoints and exact resume work as for live data. Validation replays the cached views of
the run's ``val_dir`` (:class:`CachedValidation`): the teachers are not needed, and the
``radio-lit`` command does not build them (:class:`~radio_lit.cache.CachedTeacher`).

Refused with one line before training: a cache whose teachers' weight files, Hub commits or
libraries changed since it was written (:func:`radio_lit.cache.identity.stale`; escape hatch
``accept_stale``), a run whose grouping would pair other images in a mosaic teacher's canvases
(:func:`~radio_lit.cache.grouping.grouping_problem`), and a ``max_steps`` beyond the steps a
partial cache holds. While reading, a sample whose checksum or key is wrong
(:class:`~radio_lit.cache.shards.DamagedShard`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sized
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor
from torch.utils.data import Dataset

from radio_lit.cache.grouping import grouped_key, grouping_problem, partitions_record, train_steps
from radio_lit.cache.identity import precision_change, stale
from radio_lit.cache.manifest import VAL_FILE, Manifest, check_run, epoch_order
from radio_lit.cache.shards import ShardReader, sample_key
from radio_lit.core.errors import ConfigError
from radio_lit.data.datamodule import ImageDataModule
from radio_lit.data.resumable import SeededSampler
from radio_lit.training.batch import collate_views

__all__ = ["CachedDataset", "CachedValidation", "CachedViews", "ViewSampler"]


class CachedDataset(Dataset[Mapping[str, Tensor]]):
    """The cached views of a cache folder; item ``(index, view)`` is ``{"pixels": [3, S, S]
    uint8, "<teacher>/<H>x<W>/features": [h, w, C], "<teacher>/<H>x<W>/summary": [C_s]}``,
    the outputs computed at :attr:`ranks` ranks (default: the first rank count cached).

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
        self.ranks = manifest.ranks[0]

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
        if sample >= self.manifest.num_samples:
            raise IndexError(f"view {view} of item {index} is beyond the cached steps")
        shard, position = divmod(sample, self.manifest.samples_per_shard)
        tensors = self.reader.read(shard, position, sample_key(index, view))
        return in_grouping(tensors, self.ranks)


def in_grouping(tensors: Mapping[str, Tensor], ranks: int) -> dict[str, Tensor]:
    """The crop and the outputs computed at ``ranks`` ranks, under their plain keys."""
    suffix = grouped_key("", ranks)
    return {
        key.removesuffix(suffix): value
        for key, value in tensors.items()
        if key == "pixels" or key.endswith(suffix)
    }


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
        self.ranks = manifest.ranks[0]
        if len(self.tensors["pixels"]) != manifest.val_items:
            raise ValueError(
                f"cache validation views {path} hold {len(self.tensors['pixels'])} images, the "
                f"manifest {manifest.val_items}: run radio-lit cache again into a new --out"
            )

    def __len__(self) -> int:
        return len(self.tensors["pixels"])

    def __getitem__(self, index: int) -> Mapping[str, Tensor]:
        return in_grouping({key: value[index] for key, value in self.tensors.items()}, self.ranks)


class ViewSampler(SeededSampler):
    """The live run's order (:class:`SeededSampler`, same seed), yielding ``(index, view)``
    with ``view = epoch mod views``; in a cache of the first ``samples`` samples only, a
    view's epoch ends where its cached samples do."""

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int,
        rank: int,
        seed: int,
        views: int,
        samples: int | None = None,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, seed=seed)
        self.views = views
        self.samples = samples

    def places(self) -> int:
        """This rank's places of the current view that the cache holds."""
        view, count = self.epoch % self.views, len(self.dataset)  # type: ignore[arg-type]
        places = count if self.samples is None else min(count, self.samples - view * count)
        return min(self.num_samples, max(0, -(-(places - self.rank) // self.num_replicas)))

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        for index in self.indices():
            yield index, self.epoch % self.views


class CachedViews(ImageDataModule):
    """Training batches read from a teacher-feature cache (see the module docstring).

    Args:
        path: the folder ``radio-lit cache --out`` wrote.
        batch_size: images per batch and per rank; ``None``: the cached run's.
        num_workers: DataLoader worker processes reading the shards.
        accept_stale: train on a cache whose teachers' weight files, Hub commits, libraries
            or precision changed since it was written (a warning per change instead of the
            refusal) [choice: an explicit escape hatch, e.g. after an upgrade known not to
            change the teachers' outputs].

    The crop size, the seed of the order and the validation images (``val_dir``) are the
    cached run's. At ``fit`` the model's teachers and student resolutions are checked
    against the manifest (:func:`radio_lit.cache.manifest.check_run`), and the run's rank
    count, batch size and partitions against the cache's grouping.
    """

    collate = staticmethod(collate_views)

    def __init__(
        self,
        path: str,
        batch_size: int | None = None,
        num_workers: int = 0,
        accept_stale: bool = False,
    ) -> None:
        manifest = Manifest.load(path)
        self.accept_stale = accept_stale
        self._refuse_stale(path, stale(manifest.identity))
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
                    module.student_step.margin,
                )
            except ValueError as error:
                raise ConfigError(f"data.init_args.path: {error}") from error
            self._check_grouping(module)
            precision = str(self.trainer.precision)
            self._refuse_stale(self.path, precision_change(self.manifest.identity, precision))
        super().setup(stage)

    def _refuse_stale(self, path: str, changes: list[str]) -> None:
        """One line for the first change (or, with ``accept_stale``, a warning for each)."""
        if not changes:
            return
        if self.accept_stale:
            for change in changes:
                warnings.warn(f"stale cache {path} accepted: {change}", stacklevel=2)
            return
        raise ConfigError(
            f"data.init_args.path: the cache {path} is stale: {changes[0]}: write it again "
            "with radio-lit cache (into a new --out), or pass --data.init_args.accept_stale "
            "true to train on it anyway"
        )

    def _check_grouping(self, module: Any) -> None:
        """Read the outputs of this run's rank count; refuse a grouping that mosaics would
        not reproduce, and a ``max_steps`` beyond a partial cache."""
        trainer, manifest = self.trainer, self.manifest
        world = int(trainer.world_size)
        problem = grouping_problem(
            manifest.grouping,
            manifest.mosaic_teachers,
            world,
            self.batch_size,
            partitions_record(module.partitions),
        )
        if problem is not None:
            raise ConfigError(f"data.init_args.path: {problem}")
        ranks = world if world in manifest.ranks else manifest.ranks[0]
        self.train_data.ranks = ranks
        if self.val_data is not None:
            self.val_data.ranks = ranks
        if manifest.samples is None or trainer.max_steps is None or trainer.max_steps < 0:
            return
        items = manifest.num_items
        per_epoch = train_steps(items, world, self.batch_size)
        full, rest = divmod(manifest.samples, items)
        held = full * per_epoch + min(per_epoch, rest // (self.batch_size * world))
        if trainer.max_steps > held:
            raise ConfigError(
                f"trainer.max_steps: the cache {self.path} holds the first {held} steps of a "
                f"run at {world} rank(s) ({manifest.created_by or 'radio-lit cache'}), this run "
                f"takes {trainer.max_steps}: write a cache for this run with radio-lit cache "
                "--views epochs and this max_steps (into a new --out)"
            )

    def build_train_dataset(self) -> CachedDataset:
        return self.train_data

    def build_val_dataset(self) -> CachedValidation:
        assert self.val_data is not None  # val_dir is set only when the cache has views of it
        return self.val_data

    def train_sampler(self, dataset: Sized, num_replicas: int, rank: int) -> SeededSampler:
        manifest = self.manifest
        return ViewSampler(dataset, num_replicas, rank, self.seed, manifest.views, manifest.samples)

    def seeded_items(self, dataset: Dataset[Any]) -> Dataset[Any]:
        return dataset  # keyed by (index, view) already
