"""A folder of images, searched recursively, as a map-style dataset of crops.

Unreadable files (corrupt, truncated, or not images despite their extension) are skipped,
never fatal: the dataset falls back to the next readable index, remembers the file as bad
(shared across DataLoader worker processes), and logs one warning naming it.

The photographs shipped with the package are addressed by the root :data:`SAMPLE_IMAGES`
(``"radio_lit:sample_images"``), which is how configs point at them.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from radio_lit.data.transforms import (
    IMAGE_EXTENSIONS,
    ImageTransform,
    UnreadableImageError,
    load_rgb,
    read_crop,
)

logger = logging.getLogger(__name__)

#: Root value that stands for the photographs shipped with the package.
SAMPLE_IMAGES = "radio_lit:sample_images"


def sample_images_dir() -> Path:
    """The folder of real photographs shipped with the package (see its README.md)."""
    path = Path(str(resources.files("radio_lit") / "assets" / "images"))
    if not path.is_dir():
        raise FileNotFoundError(
            f"the sample images folder {path} is missing: radio_lit must be installed from a "
            "source tree or wheel that includes its package data (not from a zip archive)"
        )
    return path


def resolve_image_root(root: str | os.PathLike[str]) -> Path:
    """``root`` as a path; :data:`SAMPLE_IMAGES` maps to :func:`sample_images_dir`."""
    if os.fspath(root) == SAMPLE_IMAGES:
        return sample_images_dir()
    return Path(root).expanduser()


def list_images(root: str | os.PathLike[str]) -> list[Path]:
    """All files under ``root`` (recursive, following links) with an image extension.

    Extensions (:data:`IMAGE_EXTENSIONS`) are matched case-insensitively; the order is the
    sorted relative POSIX path, so it is the same on every machine. Raises
    ``FileNotFoundError`` naming the path and the accepted extensions if the folder is
    missing or holds no image.
    """
    root = resolve_image_root(root)
    accepted = ", ".join(IMAGE_EXTENSIONS)
    if not root.is_dir():
        raise FileNotFoundError(
            f"image folder {root} does not exist or is not a directory "
            f"(expected a folder of {accepted} files, searched recursively)"
        )
    relative = [
        os.path.relpath(os.path.join(folder, name), root)
        for folder, _, names in os.walk(root, followlinks=True)
        for name in names
        if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
    ]
    if not relative:
        raise FileNotFoundError(
            f"no images found in {root}: expected files ending in {accepted} "
            "(any letter case), searched recursively"
        )
    return [root / rel for rel in sorted(relative, key=lambda rel: Path(rel).as_posix())]


def check_decodable(paths: list[Path], root: Path) -> None:
    """Raise ``ValueError`` if none of ``paths`` (the images of ``root``) decodes, naming the
    first one and why; decodes until the first readable image (JPEGs at a reduced scale), so
    a healthy folder costs one small decode."""
    first: UnreadableImageError | None = None
    for path in paths:
        try:
            load_rgb(path, before_decoding=lambda image: image.draft("RGB", (64, 64)))
            return
        except UnreadableImageError as error:
            first = first or error
    reason = f"{first.__cause__}" if first is not None and first.__cause__ else "unreadable"
    raise ValueError(
        f"none of the {len(paths)} image files in {root} can be decoded (e.g. {paths[0]}: "
        f"{reason}); give a folder of readable images"
    )


class ImageFolderDataset(Dataset[Tensor]):
    """Every image under ``root``; item ``i`` is ``transform(image_i)``, ``[3, S, S]`` uint8.

    Args:
        root: folder searched recursively (see :func:`list_images`), or :data:`SAMPLE_IMAGES`.
        transform: decoded RGB PIL image -> ``[3, S, S]`` uint8 tensor (``transforms.py``).

    An unreadable file is skipped: the item falls back to the next index (cyclically) that
    decodes, so the same index always yields the same file. Bad files are remembered in
    shared memory, so :attr:`num_skipped` and :attr:`bad_paths` also count what DataLoader
    workers found, and a known-bad file is not decoded again.
    """

    def __init__(self, root: str | os.PathLike[str], transform: ImageTransform) -> None:
        self.root = resolve_image_root(root)
        self.paths = list_images(self.root)
        self.transform = transform
        self._bad = torch.zeros(len(self.paths), dtype=torch.bool).share_memory_()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Tensor:
        """``[3, S, S]`` uint8 crop of image ``index``, or of the next readable one."""
        count = len(self.paths)
        if not 0 <= index < count:
            raise IndexError(f"index {index} out of range for {count} images")
        for offset in range(count):
            candidate = (index + offset) % count
            if self._bad[candidate]:
                continue
            try:
                return read_crop(self.transform, self.paths[candidate])
            except UnreadableImageError as err:
                self._mark_bad(candidate, err)
        raise RuntimeError(f"none of the {count} image files in {self.root} can be decoded")

    @property
    def num_skipped(self) -> int:
        """Number of distinct files found unreadable so far."""
        return int(self._bad.sum())

    @property
    def bad_paths(self) -> set[Path]:
        """The files found unreadable so far."""
        return {self.paths[i] for i in self._bad.nonzero().flatten().tolist()}

    def _mark_bad(self, index: int, err: UnreadableImageError) -> None:
        if not self._bad[index]:
            self._bad[index] = True
            logger.warning("skipping unreadable image %s: %s", self.paths[index], err.__cause__)
