"""Labeled images for the evaluation measures, and their split across ranks.

Two sources give ``(image [3, S, S] uint8, label)`` items:

* :class:`LabeledImageFolder`: a folder laid out as ``<root>/<class>/**/*.jpg`` (ImageNet's
  ``train/`` and ``val/`` folders after the usual ``valprep.sh``, or any other labeled folder);
  the classes are the sorted subfolder names;
* :class:`SampleImageClasses` (root ``"radio_lit:sample_classes"``): one class per photograph
  shipped with the package, its items being deterministic random crops of that photograph
  (different seeds for the ``train`` and ``eval`` splits). Nothing is downloaded, so the
  quickstart shows kNN and zero-shot results on a fresh machine. These classes are *instances*
  (which photograph a crop comes from), not semantic categories: the measure tells how well the
  summary recognizes an image under re-cropping, which even random-weight teachers support
  (their features keep colour and texture statistics), not what ImageNet accuracy would be.

:func:`rank_batches` splits a dataset across the ranks so that every rank runs the same
number of batches (ranks with fewer items repeat their last one, masked out): under FSDP the
student's forward is collective, so every rank must call it equally often.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from radio_lit.data.image_folder import ImageFolderDataset, list_images, sample_images_dir
from radio_lit.data.transforms import eval_transform, load_rgb, train_transform

#: Root that stands for the shipped photographs as a labeled set (one class per photograph).
SAMPLE_CLASSES = "radio_lit:sample_classes"

LabeledItem = tuple[Tensor, int]


class LabeledImageFolder(Dataset[LabeledItem]):
    """``<root>/<class>/**/<image>`` as ``(image [3, S, S] uint8, class index)`` items.

    Images are resized (short side ``crop_size``) and center-cropped (the kNN and zero-shot
    protocols of NVlabs/RADIO ``examples/``). ``classes`` fixes the class order, so that an
    evaluation split uses the training split's indices; by default the sorted subfolders.

    Raises ``FileNotFoundError`` naming the folder if it has no class subfolder, and
    ``ValueError`` if it holds a class that ``classes`` does not list.
    """

    def __init__(
        self, root: str | os.PathLike[str], crop_size: int, classes: list[str] | None = None
    ) -> None:
        self.root = Path(root).expanduser()
        found = (
            sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
        )
        if not found:
            raise FileNotFoundError(
                f"labeled image folder {self.root} has no class subfolders: expected "
                "<root>/<class name>/<images> (e.g. ImageNet's train/ or val/ folder)"
            )
        self.classes = list(classes) if classes is not None else found
        unknown = sorted(set(found) - set(self.classes))
        if unknown:
            raise ValueError(
                f"{self.root} has classes {unknown[:5]} that the training split does not have; "
                "the evaluation split's class folders must be among the training split's"
            )
        index = {name: i for i, name in enumerate(self.classes)}
        self.items = [
            (path, index[name]) for name in found for path in list_images(self.root / name)
        ]
        self.transform = eval_transform(crop_size)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> LabeledItem:
        path, label = self.items[i]
        return self.transform(load_rgb(path)), label


class SampleImageClasses(Dataset[LabeledItem]):
    """The shipped photographs as classes: item ``i`` is crop ``i // n`` of photograph ``i % n``.

    Each crop is a random-resized crop (area 25-100% of the photograph) drawn from a generator
    seeded by the split and the item index, so a split is the same on every machine and the
    ``train`` and ``eval`` splits hold different crops.

    Args:
        split: ``"train"`` or ``"eval"``.
        crop_size: side of the crops.
        per_class: crops per photograph.
    """

    SEEDS = {"train": 0, "eval": 1}

    def __init__(self, split: str, crop_size: int, per_class: int) -> None:
        if split not in self.SEEDS:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.paths = list_images(sample_images_dir())
        self.classes = [p.stem.replace("_", " ") for p in self.paths]
        self.images = [load_rgb(p) for p in self.paths]
        self.seed = self.SEEDS[split]
        self.per_class = per_class
        self.transform = train_transform(crop_size, scale=(0.25, 1.0))

    def __len__(self) -> int:
        return len(self.paths) * self.per_class

    def __getitem__(self, i: int) -> LabeledItem:
        label = i % len(self.paths)
        state = torch.get_rng_state()
        try:
            # the CPU generator only (as radio_lit.data.resumable.seeded): its state is restored
            torch.random.default_generator.manual_seed(1_000_003 * self.seed + i)
            crop = self.transform(self.images[label])
        finally:
            torch.set_rng_state(state)
        return crop, label


def labeled_images(
    root: str, split: str, crop_size: int, per_class: int, classes: list[str] | None = None
) -> Dataset[LabeledItem]:
    """:class:`SampleImageClasses` for :data:`SAMPLE_CLASSES`, else a labeled folder."""
    if root == SAMPLE_CLASSES:
        return SampleImageClasses(split, crop_size, per_class)
    return LabeledImageFolder(root, crop_size, classes)


def unlabeled_images(root: str, crop_size: int, limit: int | None) -> Dataset[Tensor]:
    """Unlabeled images ``[3, S, S]`` uint8 (resize + center crop) of a folder, or the
    photographs shipped with the package for ``"radio_lit:sample_images"``; at most ``limit``."""
    folder = ImageFolderDataset(root, eval_transform(crop_size))
    if limit is not None and limit < len(folder):
        return Subset(folder, range(limit))
    return folder


def world() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_batches(
    dataset: Dataset, batch_size: int, num_workers: int = 0
) -> Iterator[tuple[object, Tensor]]:
    """This rank's share of ``dataset`` in batches, with a validity mask per batch.

    Rank ``r`` of ``W`` takes items ``r, r + W, r + 2W, ...``; every rank yields
    ``ceil(ceil(N / W) / batch_size)`` batches, a short share being padded with repeats of
    its last item (or item 0) whose mask entries are ``False``.

    Yields:
        ``(batch, valid)``: the default-collated batch and ``valid [b]`` bool.
    """
    rank, size = world()
    count = len(dataset)  # type: ignore[arg-type]
    per_rank = math.ceil(count / size)
    mine = list(range(rank, count, size))
    valid = torch.zeros(per_rank, dtype=torch.bool)
    valid[: len(mine)] = True
    mine += [mine[-1] if mine else 0] * (per_rank - len(mine))
    loader = DataLoader(Subset(dataset, mine), batch_size=batch_size, num_workers=num_workers)
    for start, batch in zip(range(0, per_rank, batch_size), loader, strict=True):
        yield batch, valid[start : start + batch_size]


def gather(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor [n_r, ...]`` from every rank along dim 0 (shapes may differ in n)."""
    rank, size = world()
    if size == 1:
        return tensor
    from torchmetrics.utilities.distributed import gather_all_tensors

    return torch.cat(gather_all_tensors(tensor.contiguous()))
