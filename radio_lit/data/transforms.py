"""Per-image CPU transforms: decode -> RGB -> one crop -> ``[3, S, S]`` uint8.

Every dataset of this package decodes with :func:`load_rgb` and crops with the transforms
below, so a batch is always ``[B, 3, S, S]`` uint8 at a fixed crop side ``S``. Views for the
student and the teachers are made later from that crop, on the device (``views.py``).

Training uses one random-resized crop per image (AM-RADIO: "random scale + cropping");
evaluation a deterministic resize of the short side to ``S`` followed by a center crop.
Crops are done on the PIL image, before conversion to a tensor, so large photos are never
converted to a tensor at full size.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image
from torch import Tensor
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

#: File extensions read as images (compared case-insensitively).
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp")

#: A per-image transform: decoded RGB PIL image -> ``[3, S, S]`` uint8 tensor.
ImageTransform = Callable[[Image.Image], Tensor]


class UnreadableImageError(OSError):
    """An image file or byte string that cannot be decoded (corrupt, truncated, not an image)."""


def load_rgb(
    source: str | os.PathLike[str] | bytes,
    name: str | None = None,
    before_decoding: Callable[[Image.Image], None] | None = None,
) -> Image.Image:
    """Decode an image file (path) or encoded bytes into a fully loaded RGB PIL image.

    Every image the package reads (training, the cache, ``predict``, evaluation) goes through
    here, so each mode is scaled to 8 bits one way (:func:`to_rgb`). Any decoding failure
    raises :class:`UnreadableImageError` naming ``name`` (or the path), with the decoder's
    exception as its cause. ``before_decoding`` gets the opened image (its header read: size
    and mode known, no pixel decoded), e.g. to ask for a reduced-scale decode
    (:meth:`RandomResizedCrop.read`).
    """
    if name is None:
        name = "<bytes>" if isinstance(source, bytes) else os.fspath(source)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            if before_decoding is not None:
                before_decoding(image)
            return to_rgb(image)
    except Exception as err:  # decoders raise many types (OSError, SyntaxError, struct.error, ...)
        raise UnreadableImageError(f"cannot decode image {name}: {err}") from err


def read_crop(
    transform: ImageTransform, source: str | os.PathLike[str] | bytes, name: str | None = None
) -> Tensor:
    """``transform``'s crop of the image in ``source`` (a path or encoded bytes): through the
    transform's own ``read`` when it has one (:class:`RandomResizedCrop` decodes a large JPEG
    at a reduced scale), else :func:`load_rgb` then ``transform``. Decoding failures raise
    :class:`UnreadableImageError`."""
    read = getattr(transform, "read", None)
    return read(source, name) if read is not None else transform(load_rgb(source, name))


#: Full scale of the integer modes ``I;16*`` and ``I``: 16-bit samples (a 16-bit PNG or TIFF
#: opens as ``I;16``, or as ``I`` in older Pillow releases). [choice] ``I`` is read as 16-bit,
#: not as the full 32-bit range no file format uses for pixels.
WIDE_INTEGER_MAX = 65535.0


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB, each mode scaled to ``[0, 255]`` over its own range.

    - ``I;16``, ``I;16B``, ``I``...: 16-bit gray, ``v * 255 / 65535`` (PIL's ``convert``
      clips at 255: a 16-bit PNG would turn almost all white);
    - ``F``: [choice] float gray in ``[0, 1]`` (the float image convention), ``v * 255``,
      clipped (PIL's ``convert`` would read it as ``[0, 255]``: almost all black);
    - ``La`` / ``RGBa`` (premultiplied alpha) are un-premultiplied first;
    - ``P`` (palette, possibly transparent) goes through ``RGBA``;
    - every other mode (``1``, ``L``, ``LA``, ``RGBA``, ``CMYK``, ``YCbCr``...) by PIL's
      ``convert``. [choice] Alpha is dropped: colours as stored, not composited on a
      background (as ``torchvision.io.decode_image(..., mode=RGB)`` does).
    """
    image.load()
    if image.mode.startswith("I") or image.mode == "F":
        scale = 255.0 if image.mode == "F" else 255.0 / WIDE_INTEGER_MAX
        values = np.asarray(image, dtype=np.float64) * scale
        gray = np.clip(np.rint(values), 0, 255).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")  # 2-D uint8: mode L
    if image.mode in _PREMULTIPLIED:
        image = image.convert(_PREMULTIPLIED[image.mode])
    if image.mode == "P":  # palette images may carry transparency: RGBA avoids PIL's warning
        image = image.convert("RGBA")
    return image.convert("RGB")


#: Premultiplied-alpha modes and the straight-alpha mode each is read through.
_PREMULTIPLIED = {"La": "LA", "RGBa": "RGBA"}


class RandomResizedCrop:
    """One random-resized crop of side ``S`` -> ``[3, S, S]`` uint8 (torchvision's
    ``RandomResizedCrop``, antialiased bilinear, then ``PILToTensor``).

    Called on a decoded image it is torchvision's transform. :meth:`read` takes the file
    instead, draws the crop box from the header's size (the same random numbers, so the same
    box) and decodes a JPEG at the smallest of libjpeg's DCT scales (1/2, 1/4, 1/8; PIL's
    ``draft``) that still gives the box at least ``S`` pixels per side: a web photograph of
    2048 px cropped to 384 px is decoded at 1/2 or 1/4 of its side, which is where a data
    loader's time goes (``benchmarks/data_loading.py``). [choice] The box's pixels then come
    from the DCT's downscale followed by the bilinear resize, instead of the resize alone;
    ``reduced_decoding=False`` decodes every image in full (torchvision's crop exactly).
    """

    def __init__(
        self,
        crop_size: int,
        scale: tuple[float, float],
        ratio: tuple[float, float],
        reduced_decoding: bool = True,
    ) -> None:
        self.crop_size = crop_size
        self.crop = v2.RandomResizedCrop(crop_size, scale=scale, ratio=ratio, antialias=True)
        self.reduced_decoding = reduced_decoding

    def __call__(self, image: Image.Image) -> Tensor:
        return pil_to_tensor(self.crop(image))

    def read(self, source: str | os.PathLike[str] | bytes, name: str | None = None) -> Tensor:
        """The crop of the image in ``source`` (a path or encoded bytes), decoded at the
        smallest scale the crop allows; decoding failures raise :class:`UnreadableImageError`."""
        if not self.reduced_decoding:
            return self(load_rgb(source, name))
        box: dict[str, Any] = {}

        def draft(image: Image.Image) -> None:
            box.update(self.crop.make_params([image]))  # from the header's size
            width, height = image.size
            side = self.crop_size
            needed = (-(-width * side // box["width"]), -(-height * side // box["height"]))
            box["size"] = image.size
            image.draft(image.mode, needed)  # a no-op for formats without reduced decoding

        image = load_rgb(source, name, before_decoding=draft)
        full = box.pop("size")
        if image.size == full:
            return pil_to_tensor(self.crop.transform(image, box))
        sx, sy = image.width / full[0], image.height / full[1]
        left, top = box["left"] * sx, box["top"] * sy
        area = (left, top, left + box["width"] * sx, top + box["height"] * sy)
        side = (self.crop_size, self.crop_size)
        return pil_to_tensor(image.resize(side, Image.Resampling.BILINEAR, box=area))


def train_transform(
    crop_size: int,
    scale: tuple[float, float] = (0.35, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    reduced_decoding: bool = True,
) -> RandomResizedCrop:
    """One random-resized crop of side ``crop_size`` -> ``[3, S, S]`` uint8
    (:class:`RandomResizedCrop`).

    ``scale`` is the range of the crop's area as a fraction of the image's area and ``ratio``
    the range of its aspect ratio before resizing (antialiased bilinear);
    ``reduced_decoding``: a large JPEG is decoded at the smallest DCT scale the crop allows.
    """
    _check_crop_size(crop_size)
    low, high = scale
    if not 0.0 < low <= high <= 1.0:
        raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale}")
    return RandomResizedCrop(crop_size, scale, ratio, reduced_decoding)


def eval_transform(crop_size: int) -> ImageTransform:
    """Resize the short side to ``crop_size`` and center-crop -> ``[3, S, S]`` uint8."""
    _check_crop_size(crop_size)
    return v2.Compose(
        [v2.Resize(crop_size, antialias=True), v2.CenterCrop(crop_size), v2.PILToTensor()]
    )


def _check_crop_size(crop_size: int) -> None:
    if crop_size <= 0:
        raise ValueError(f"crop_size must be positive, got {crop_size}")
