"""Images with per-pixel labels for the segmentation probe, and the probe's crops and resizes.

Two sources give ``(image [3, H, W] uint8, labels [H, W] int64)`` items, labels ``0`` meaning
"ignored" (ADE20k's "other") and ``1..K`` the classes:

* :class:`SegmentationFolder`: ADE20k's layout, ``<root>/images/<split>/<name>.jpg`` with
  ``<root>/annotations/<split>/<name>.png`` (splits ``training`` and ``validation``; any
  class count);
* :class:`SampleSegmentation` (root ``"radio_lit:sample_segmentation"``): a synthetic set
  made from the photographs shipped with the package. Each image is a Voronoi partition of
  the canvas into a few regions, each region filled with a crop of one photograph and
  labelled with that photograph's index + 1 (10 classes); pixels near a region boundary are
  labelled 0. A feature extractor tells the regions apart by their photograph's colour and
  texture, so a linear probe on real features scores far above a constant predictor, offline
  and in seconds. :func:`write_segmentation_folder` writes it in ADE20k's layout.

The probe's geometry follows mmsegmentation's ADE20k pipeline (NVlabs/RADIO's linear-probe
config): :func:`random_scale_crop` for training, :func:`resize_short_side` for evaluation.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset, Subset
from torchvision.transforms.functional import pil_to_tensor

from radio_lit.data.image_folder import list_images, sample_images_dir
from radio_lit.data.transforms import load_rgb

#: Root that stands for the synthetic segmentation set made from the shipped photographs.
SAMPLE_SEGMENTATION = "radio_lit:sample_segmentation"
#: ADE20k's split folder names.
SPLITS = ("training", "validation")
#: Label of the pixels that count neither in the loss nor in the metric (after shifting
#: ADE20k's ``0 = other`` out of the classes: mmseg's ``reduce_zero_label``).
IGNORE = -100

SegmentationItem = tuple[Tensor, Tensor]


class SegmentationFolder(Dataset[SegmentationItem]):
    """ADE20k's layout: ``images/<split>/*.jpg`` and ``annotations/<split>/*.png`` (same stems).

    Raises ``FileNotFoundError`` naming the folder and the expected layout when the split has
    no image, or an image no annotation.
    """

    def __init__(self, root: str | os.PathLike[str], split: str) -> None:
        self.root = Path(root).expanduser()
        images = self.root / "images" / split
        self.images = list_images(images) if images.is_dir() else []
        if not self.images:
            raise FileNotFoundError(
                f"segmentation folder {self.root} has no images in images/{split}/: expected "
                "ADE20k's layout, images/{training,validation}/*.jpg with "
                "annotations/{training,validation}/*.png"
            )
        self.labels = [self.root / "annotations" / split / f"{p.stem}.png" for p in self.images]
        missing = [p for p in self.labels if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{missing[0]} does not exist: every images/{split}/<name>.jpg needs "
                f"annotations/{split}/<name>.png (label 0 = ignored, 1..K = classes)"
            )

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> SegmentationItem:
        image = pil_to_tensor(load_rgb(self.images[i]))
        with Image.open(self.labels[i]) as png:
            labels = torch.from_numpy(np.array(png, dtype=np.int64))
        if labels.shape != image.shape[1:]:
            raise ValueError(
                f"{self.labels[i]} is {tuple(labels.shape)}, its image "
                f"{tuple(image.shape[1:])}: an annotation must have its image's size"
            )
        return image, labels


class SampleSegmentation(Dataset[SegmentationItem]):
    """The synthetic set: item ``i`` of a split is drawn from a generator seeded by the split
    and ``i`` (the same on every machine; the splits differ).

    Args:
        split: ``"training"`` or ``"validation"``.
        count: items in the split.
        size: ``(H, W)`` of the images.
        regions: Voronoi regions per image (distinct photographs).
        border: pixels whose two nearest region centres are closer than this (in pixels)
            to equidistant are labelled 0 (ignored).
    """

    def __init__(
        self,
        split: str,
        count: int,
        size: tuple[int, int] = (128, 160),
        regions: int = 4,
        border: float = 2.0,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        # The photographs at twice the canvas' long side: crops cost little to resize.
        side = 2 * max(size)
        self.photos = [
            pil_to_tensor(_shrink(load_rgb(p), side)) for p in list_images(sample_images_dir())
        ]
        if not 1 <= regions <= len(self.photos):
            raise ValueError(f"regions must be in 1..{len(self.photos)}, got {regions}")
        self.seed = SPLITS.index(split)
        self.count, self.size, self.regions, self.border = count, tuple(size), regions, border
        self._items: dict[int, SegmentationItem] = {}  # drawn once, then reused

    @property
    def num_classes(self) -> int:
        return len(self.photos)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> SegmentationItem:
        if i not in self._items:
            self._items[i] = self._draw(i)
        return self._items[i]

    def _draw(self, i: int) -> SegmentationItem:
        generator = torch.Generator().manual_seed(1_000_003 * self.seed + i)
        height, width = self.size
        centres = torch.rand(self.regions, 2, generator=generator) * torch.tensor([height, width])
        classes = torch.randperm(len(self.photos), generator=generator)[: self.regions]
        ys, xs = torch.meshgrid(
            torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij"
        )
        distance = torch.cdist(torch.stack([ys, xs], -1).view(-1, 2), centres)  # [H W, R]
        nearest = distance.topk(min(2, self.regions), dim=1, largest=False)
        region = nearest.indices[:, 0].view(height, width)
        image = torch.empty(3, height, width, dtype=torch.uint8)
        for r, photo_index in enumerate(classes.tolist()):
            crop = _random_crop(self.photos[photo_index], (height, width), generator)
            image[:, region == r] = crop[:, region == r]
        labels = classes[region] + 1
        if self.regions > 1:
            gap = (nearest.values[:, 1] - nearest.values[:, 0]).view(height, width)
            labels[gap < self.border] = 0
        return image, labels


def _shrink(image: Image.Image, side: int) -> Image.Image:
    """``image`` with its short side at most ``side`` (aspect kept)."""
    scale = side / min(image.size)
    if scale >= 1:
        return image
    return image.resize((round(image.width * scale), round(image.height * scale)), Image.BICUBIC)


def _random_crop(photo: Tensor, size: tuple[int, int], generator: torch.Generator) -> Tensor:
    """A crop of 40-100 % of ``photo``'s short side at a random place, resized to ``size``."""
    _, height, width = photo.shape
    side = int(min(height, width) * (0.4 + 0.6 * float(torch.rand(1, generator=generator))))
    top = int(torch.randint(0, height - side + 1, (1,), generator=generator))
    left = int(torch.randint(0, width - side + 1, (1,), generator=generator))
    crop = photo[None, :, top : top + side, left : left + side].float()
    resized = F.interpolate(crop, size=size, mode="bilinear", antialias=True, align_corners=False)
    return resized[0].round().clamp(0, 255).to(torch.uint8)


def segmentation_set(root: str, split: str, count: int) -> Dataset[SegmentationItem]:
    """:class:`SampleSegmentation` (``count`` items) for :data:`SAMPLE_SEGMENTATION`, else
    :class:`SegmentationFolder`."""
    if root == SAMPLE_SEGMENTATION:
        return SampleSegmentation(split, count)
    return SegmentationFolder(root, split)


def write_segmentation_folder(
    dataset: Dataset[SegmentationItem], root: str | os.PathLike[str], split: str
) -> Path:
    """Write ``dataset`` in ADE20k's layout under ``root`` (JPEG images, PNG labels < 256)."""
    root = Path(root)
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations" / split).mkdir(parents=True, exist_ok=True)
    for i in range(len(dataset)):  # type: ignore[arg-type]
        image, labels = dataset[i]
        name = f"{split}_{i:05d}"
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(
            root / "images" / split / f"{name}.jpg", quality=95
        )
        Image.fromarray(labels.to(torch.uint8).numpy()).save(
            root / "annotations" / split / f"{name}.png"
        )
    return root


def image_sizes(dataset: Dataset[SegmentationItem]) -> list[tuple[int, int]]:
    """``(H, W)`` of every image of a segmentation set (or a ``Subset`` of one), read from the
    files' headers without decoding."""
    if isinstance(dataset, Subset):
        sizes = image_sizes(dataset.dataset)
        return [sizes[i] for i in dataset.indices]
    if isinstance(dataset, SampleSegmentation):
        return [dataset.size] * len(dataset)
    sizes = []
    for path in dataset.images:  # type: ignore[attr-defined]
        with Image.open(path) as image:
            sizes.append((image.height, image.width))
    return sizes


def shift_labels(labels: Tensor) -> Tensor:
    """ADE20k labels ``0..K`` -> class indices ``0..K-1``, ``0`` becoming :data:`IGNORE`
    (mmseg's ``reduce_zero_label``)."""
    return torch.where(labels > 0, labels - 1, torch.full_like(labels, IGNORE))


def resize_short_side(image: Tensor, side: int, max_long: int) -> Tensor:
    """``[..., 3, H, W]`` float images resized (antialiased bilinear) so that the short side
    is ``side`` and the long side at most ``max_long`` (mmseg's ``Resize(scale=(max_long,
    side), keep_ratio=True)``)."""
    height, width = image.shape[-2:]
    scale = min(side / min(height, width), max_long / max(height, width))
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    if size == (height, width):
        return image
    return F.interpolate(image, size=size, mode="bilinear", antialias=True, align_corners=False)


def random_scale_crop(
    image: Tensor,
    labels: Tensor,
    crop: int,
    generator: torch.Generator,
    ratio_range: tuple[float, float] = (0.5, 2.0),
) -> tuple[Tensor, Tensor]:
    """One training crop (mmseg's ADE20k training pipeline, photometric distortion left out).

    The image is rescaled to short side ``crop * r`` (long side at most ``4 crop r``), ``r``
    uniform in ``ratio_range``, randomly cropped to ``crop x crop``, flipped with probability
    1/2 and padded (image 0, labels :data:`IGNORE`) where it is smaller.

    Args:
        image: ``[3, H, W]`` uint8.
        labels: ``[H, W]`` class indices (:func:`shift_labels`).
        crop: side of the crop.
        generator: the random source.

    Returns:
        ``image [3, crop, crop]`` float in ``[0, 1]`` and ``labels [crop, crop]``.
    """
    low, high = ratio_range
    ratio = low + (high - low) * float(torch.rand(1, generator=generator))
    side = max(1, round(crop * ratio))
    scaled = resize_short_side(image[None].float() / 255.0, side, 4 * side)[0]
    height, width = scaled.shape[-2:]
    scaled_labels = F.interpolate(labels[None, None].float(), size=(height, width), mode="nearest")
    scaled_labels = scaled_labels[0, 0].long()
    top = int(torch.randint(0, max(height - crop, 0) + 1, (1,), generator=generator))
    left = int(torch.randint(0, max(width - crop, 0) + 1, (1,), generator=generator))
    out_image = scaled[:, top : top + crop, left : left + crop]
    out_labels = scaled_labels[top : top + crop, left : left + crop]
    if float(torch.rand(1, generator=generator)) < 0.5:
        out_image, out_labels = out_image.flip(-1), out_labels.flip(-1)
    pad = (0, crop - out_image.shape[-1], 0, crop - out_image.shape[-2])
    return F.pad(out_image, pad), F.pad(out_labels, pad, value=IGNORE)


def window_starts(length: int, window: int, stride: int) -> list[int]:
    """Starts of ``window``-long windows covering ``length`` with ``stride`` (the last one
    ends at ``length``; mmseg's slide inference)."""
    if length <= window:
        return [0]
    count = math.ceil((length - window) / stride) + 1
    return [min(i * stride, length - window) for i in range(count)]
