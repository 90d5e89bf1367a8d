"""Mosaic augmentation for SAM (RADIOv2.5 4.3, supplement J)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radio_lit.teachers.mosaic import mosaic_layout, pack, unpack
from tests.teachers.tiny import tiny_sam_teacher


@pytest.mark.parametrize(
    ("side", "k", "padding"),
    [(256, 4, 0), (432, 2, 80), (512, 2, 0), (1024, 1, 0)],  # RADIOv2.5 4.3's two examples first
)
def test_layouts_at_sam_1024(side, k, padding):
    layout = mosaic_layout(side, 1024, 16)
    assert (layout.k, layout.padding) == (k, padding)
    assert layout.k * layout.tile <= 1024


def test_pack_unpack_round_trip_is_exact():
    """With a patch-wise encoder (16x16 average), each view's cells cut out of the mosaics
    are exactly the cells of the view encoded alone; unused tiles stay zero."""
    layout = mosaic_layout(32, 128, 16)  # k = 4: 16 views per mosaic
    views = torch.randn(20, 3, 32, 32)
    mosaics = pack(views, layout)
    assert mosaics.shape == (2, 3, 128, 128)
    assert mosaics[1, :, 32:].abs().sum() == 0  # views 20..31 of the last mosaic are padding
    encode = lambda x: F.avg_pool2d(x, 16).permute(0, 2, 3, 1)  # noqa: E731
    torch.testing.assert_close(unpack(encode(mosaics), layout, 20), encode(views))


def test_padded_tiles_round_trip():
    layout = mosaic_layout(48, 128, 16)  # k = 2, tiles of 64 px: 16 px padding per tile
    assert (layout.k, layout.padding) == (2, 16)
    views = torch.randn(5, 3, 48, 48)
    encode = lambda x: F.avg_pool2d(x, 16).permute(0, 2, 3, 1)  # noqa: E731
    torch.testing.assert_close(unpack(encode(pack(views, layout)), layout, 5), encode(views))


def test_sam_runs_once_per_mosaic():
    sam = tiny_sam_teacher(resolution=32, mosaic=True)  # 128 px encoder: 4x4 views
    images = []
    sam.model.register_forward_pre_hook(lambda _, args: images.append(args[0].shape[0]))
    crops = torch.rand(32, 3, 32, 32)
    mosaic = sam(crops)
    assert sum(images) == 32 // 16
    assert mosaic.features.shape == (32, 2, 2, sam.feature_dim) and mosaic.summary is None
    images.clear()
    plain = tiny_sam_teacher(resolution=32)
    plain.load_state_dict(sam.model.state_dict(prefix="model."), strict=False)
    plain.model.register_forward_pre_hook(lambda _, args: images.append(args[0].shape[0]))
    assert plain(crops).features.shape == mosaic.features.shape
    assert sum(images) == 32


def test_a_view_larger_than_sam_is_a_clear_error():
    sam = tiny_sam_teacher(resolution=64, mosaic=True)
    with pytest.raises(ValueError, match="up to 128 px"):
        sam(torch.rand(1, 3, 160, 160), (160, 160))
