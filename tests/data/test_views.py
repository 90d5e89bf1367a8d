"""Per-model views of one crop: uint8 -> float, resize, normalize."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from radio_lit.data import as_float_images, normalize_view, resize_view, teacher_view


def test_uint8_becomes_float_in_unit_range() -> None:
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand(2, 3, 4, 4)
    result = as_float_images(images)
    assert result.dtype == torch.float32
    expected = torch.tensor([0.0, 0.2, 1.0]).view(1, 3, 1, 1).expand(2, 3, 4, 4)
    torch.testing.assert_close(result, expected)


def test_float_images_pass_through_unchanged() -> None:
    images = torch.rand(2, 3, 8, 8)
    assert as_float_images(images) is images


def test_single_channel_images_are_rejected_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\].*\(2, 1, 8, 8\)"):
        as_float_images(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="RGB"):
        teacher_view(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), 4, (0.5,), (0.5,))


def test_integer_images_other_than_uint8_are_rejected() -> None:
    with pytest.raises(TypeError, match="uint8 or floating point"):
        as_float_images(torch.zeros(1, 3, 4, 4, dtype=torch.int32))


def test_a_constant_crop_gives_the_normalized_constant_at_every_size() -> None:
    crop = torch.full((2, 3, 40, 30), 128, dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    for size, hw in [(16, (16, 16)), ((24, 12), (24, 12)), (64, (64, 64))]:
        view = teacher_view(crop, size, mean, std)
        assert view.shape == (2, 3, *hw)
        expected = torch.tensor([(128 / 255 - m) / s for m, s in zip(mean, std, strict=True)])
        torch.testing.assert_close(view, expected.view(1, 3, 1, 1).expand_as(view))


def test_resize_keeps_a_view_already_at_its_size() -> None:
    crop = torch.rand(1, 3, 16, 16)
    assert resize_view(crop, 16) is crop
    assert resize_view(crop, (8, 4)).shape == (1, 3, 8, 4)


def test_normalize_is_per_channel() -> None:
    view = torch.tensor([0.2, 0.5, 0.8]).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    result = normalize_view(view, mean=(0.2, 0.0, 1.0), std=(1.0, 0.5, 0.1))
    expected = torch.tensor([0.0, 1.0, -2.0]).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    torch.testing.assert_close(result, expected)


@pytest.mark.parametrize(("shape", "size"), [((2, 3, 128, 128), 56), ((1, 3, 448, 320), (61, 97))])
def test_resize_is_pils_antialiased_bilinear(shape, size) -> None:
    """The view is PIL's ``BILINEAR`` resize (a triangle filter widened by the scale factor when
    shrinking), which the teachers' own preprocessing uses, computed on float images."""
    crop = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    height, width = (size, size) if isinstance(size, int) else size
    expected = torch.stack(
        [
            torch.stack(
                [
                    torch.from_numpy(
                        np.asarray(
                            Image.fromarray(channel.numpy(), mode="F").resize(
                                (width, height), Image.BILINEAR
                            )
                        ).copy()
                    )
                    for channel in image
                ]
            )
            for image in crop
        ]
    )
    view = resize_view(crop, size)
    assert view.shape == (shape[0], 3, height, width) and view.is_contiguous()
    torch.testing.assert_close(view, expected, atol=2e-5, rtol=0)


def test_normalize_equals_subtracting_and_dividing() -> None:
    view = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(1))
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    expected = (view - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(normalize_view(view, mean, std), expected, atol=1e-6, rtol=0)
