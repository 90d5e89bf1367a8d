"""Decoding to RGB and the training / evaluation crops."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from radio_lit.data.image_folder import ImageFolderDataset, sample_images_dir
from radio_lit.data.transforms import (
    UnreadableImageError,
    eval_transform,
    load_rgb,
    to_rgb,
    train_transform,
)


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [("JPEG", "L"), ("PNG", "RGBA"), ("PNG", "P"), ("WEBP", "RGB"), ("JPEG", "CMYK")],
)
def test_load_rgb_converts_every_mode_to_rgb(make_image, fmt: str, mode: str) -> None:
    image = load_rgb(make_image(0, size=20, fmt=fmt, mode=mode))
    assert image.mode == "RGB"
    assert image.size == (20, 20)


def test_load_rgb_reads_paths(tmp_path, make_image) -> None:
    path = tmp_path / "photo.jpg"
    path.write_bytes(make_image(1, size=24))
    assert load_rgb(path).size == (24, 24)


@pytest.mark.parametrize("data", [b"", b"plain text", b"\x89PNG\r\n\x1a\n truncated"])
def test_load_rgb_raises_a_named_error_for_undecodable_bytes(data: bytes) -> None:
    with pytest.raises(UnreadableImageError, match="cannot decode image shard-7.jpg") as info:
        load_rgb(data, name="shard-7.jpg")
    assert info.value.__cause__ is not None


def test_train_transform_gives_uint8_crops_of_the_crop_size(make_image) -> None:
    image = load_rgb(make_image(2, size=96)).resize((96, 60))
    transform = train_transform(32, scale=(0.2, 1.0))
    torch.manual_seed(0)
    first, second = transform(image), transform(image)
    assert type(first) is torch.Tensor
    assert first.dtype == torch.uint8
    assert first.shape == (3, 32, 32)
    assert not torch.equal(first, second), "two random crops of one image should differ"


def test_train_transform_keeps_the_values_of_a_constant_image() -> None:
    image = Image.new("RGB", (80, 50), (10, 200, 77))
    crop = train_transform(16, scale=(0.35, 1.0))(image)
    assert crop.shape == (3, 16, 16)
    assert crop[0].eq(10).all() and crop[1].eq(200).all() and crop[2].eq(77).all()


@pytest.mark.parametrize("scale", [(0.0, 1.0), (0.8, 0.5), (0.5, 1.2)])
def test_train_transform_rejects_bad_scale_ranges(scale) -> None:
    with pytest.raises(ValueError, match="scale"):
        train_transform(32, scale=scale)


def test_eval_transform_is_a_center_crop_of_the_resized_image() -> None:
    # Three vertical stripes, each as wide as the image is high: after resizing the short
    # side to S the center crop is exactly the middle (green) stripe.
    stripes = Image.new("RGB", (300, 100))
    for i, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        stripes.paste(color, (100 * i, 0, 100 * (i + 1), 100))
    crop = eval_transform(20)(stripes)
    assert crop.dtype == torch.uint8
    assert crop.shape == (3, 20, 20)
    inner = crop[:, :, 1:-1].int()  # antialiasing may blend one pixel column at each edge
    assert inner[1].eq(255).all()
    assert inner[0].eq(0).all() and inner[2].eq(0).all()
    assert torch.equal(crop, eval_transform(20)(stripes))


def test_transforms_reject_a_non_positive_crop_size() -> None:
    with pytest.raises(ValueError, match="crop_size"):
        eval_transform(0)
    with pytest.raises(ValueError, match="crop_size"):
        train_transform(-4)


def test_a_palette_image_with_transparency_converts_without_warnings() -> None:
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 250, 10, 10] + [0] * 762)
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG", transparency=b"\x00" * 256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image = load_rgb(buffer.getvalue())
    assert image.mode == "RGB" and image.getpixel((0, 0)) == (250, 10, 10)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


#: 16-bit gray samples and the 8-bit value each must read as (``round(v * 255 / 65535)``).
WIDE = np.array([[0, 257, 1000, 32768, 60000, 65535]], dtype=np.uint16)
WIDE_AS_8_BIT = [0, 1, 4, 128, 233, 255]


def test_a_16_bit_png_is_scaled_to_8_bits_not_clipped() -> None:
    """A 16-bit PNG (mode ``I;16``) read as ``v * 255 / 65535`` (PIL's convert("RGB")
    clips at 255: every sample above 255 turned white)."""
    decoded = load_rgb(_png(Image.fromarray(WIDE)))
    assert np.asarray(decoded).tolist() == [[[v] * 3 for v in WIDE_AS_8_BIT]]


@pytest.mark.parametrize(
    ("mode", "values", "expected"),
    [
        ("I", WIDE.astype(np.int32), WIDE_AS_8_BIT),  # 16-bit PNGs in older Pillow releases
        ("F", np.array([[0.0, 0.25, 0.5, 1.0, 1.5, -0.5]], np.float32), [0, 64, 128, 255, 255, 0]),
    ],
)
def test_wide_gray_modes_are_scaled_over_their_range(mode, values, expected) -> None:
    image = Image.fromarray(values)
    assert image.mode == mode
    assert np.asarray(to_rgb(image))[..., 0].tolist() == [expected]


@pytest.mark.parametrize(
    ("mode", "color", "rgb"),
    [
        ("LA", (90, 255), (90, 90, 90)),
        ("La", (90, 255), (90, 90, 90)),
        ("RGBA", (10, 20, 30, 255), (10, 20, 30)),
        ("RGBa", (10, 20, 30, 255), (10, 20, 30)),
        ("1", 1, (255, 255, 255)),
        ("L", 77, (77, 77, 77)),
    ],
)
def test_alpha_and_gray_modes_keep_their_colours(mode, color, rgb) -> None:
    assert to_rgb(Image.new(mode, (2, 2), color)).getpixel((1, 1)) == rgb


def test_training_reads_a_16_bit_png_scaled(tmp_path) -> None:
    """The image-folder dataset (training, the cache and evaluation read through it) gets
    the scaled values: a constant 16-bit image of 32768 is mid-gray, not white."""
    (tmp_path / "wide.png").write_bytes(_png(Image.fromarray(np.full((8, 8), 32768, np.uint16))))
    crop = ImageFolderDataset(tmp_path, eval_transform(8))[0]
    assert crop.unique().tolist() == [128]


def _photograph(side: int, fmt: str) -> bytes:
    """A shipped photograph resized to ``side`` px, encoded as ``fmt``."""
    with Image.open(sample_images_dir() / "astronaut.jpg") as image:
        large = image.convert("RGB").resize((side, side), Image.Resampling.BICUBIC)
    encoded = io.BytesIO()
    large.save(encoded, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return encoded.getvalue()


def test_a_large_jpeg_is_decoded_at_a_reduced_scale_into_the_same_crop(monkeypatch) -> None:
    """The crop box is drawn from the header (the same random numbers), the JPEG decoded at a
    DCT scale that keeps the box at least the crop's side: the crop differs from the full
    decode's by resampling only; a PNG (no reduced decoding) gives torchvision's crop exactly."""
    decoded: list[tuple[int, int]] = []

    def recorded(image: Image.Image) -> Image.Image:
        decoded.append(image.size)
        return to_rgb(image)

    transform = train_transform(64)
    for fmt, side in (("JPEG", 1024), ("PNG", 256)):
        data, decoded[:] = _photograph(side, fmt), []
        for seed in range(4):
            monkeypatch.setattr("radio_lit.data.transforms.to_rgb", recorded)
            torch.manual_seed(seed)
            fast = transform.read(data)
            monkeypatch.undo()
            torch.manual_seed(seed)
            full = transform(load_rgb(data))
            assert fast.shape == full.shape == (3, 64, 64) and fast.dtype == torch.uint8
            if fmt == "PNG":
                assert torch.equal(fast, full)
            else:
                assert (fast.float() - full.float()).abs().mean() < 2.5  # of 255 levels
        smallest = min(min(size) for size in decoded)
        assert (smallest <= side // 4) if fmt == "JPEG" else (smallest == side)


def test_reduced_decoding_can_be_turned_off(monkeypatch) -> None:
    """``reduced_decoding=False`` (``data.init_args.reduced_decoding``): a large JPEG is decoded
    in full and the crop is torchvision's exactly."""
    decoded: list[tuple[int, int]] = []

    def recorded(image: Image.Image) -> Image.Image:
        decoded.append(image.size)
        return to_rgb(image)

    data, transform = _photograph(1024, "JPEG"), train_transform(64, reduced_decoding=False)
    monkeypatch.setattr("radio_lit.data.transforms.to_rgb", recorded)
    torch.manual_seed(0)
    full_read = transform.read(data)
    monkeypatch.undo()
    torch.manual_seed(0)
    assert torch.equal(full_read, transform(load_rgb(data)))
    assert decoded == [(1024, 1024)]
