"""RescaledTeacher gives tiny teachers the activation statistics of PHI-S table 7."""

from __future__ import annotations

import os

import pytest
import torch

from radio_lit.data import SAMPLE_IMAGES, as_float_images, resize_view
from radio_lit.teachers import TABLE7, FeatureStatistics, RescaledTeacher
from radio_lit.teachers.rescaled import calibration_views, feature_statistics
from tests.teachers.tiny import (
    tiny_clip_teacher,
    tiny_dinov2_teacher,
    tiny_sam_teacher,
    tiny_siglip_teacher,
)

# The inner teachers and widths of configs/ablations/base.yaml.
INNER = {
    "dfn_clip": (tiny_clip_teacher, {}, 128),
    "siglip": (tiny_siglip_teacher, {"resolution": 64}, 512),
    "dinov2": (tiny_dinov2_teacher, {}, 64),
    "sam": (tiny_sam_teacher, {"resolution": 64}, 256),
}


@pytest.fixture(scope="module")
def rescaled() -> dict[str, RescaledTeacher]:
    torch.manual_seed(0)
    return {
        name: RescaledTeacher(build(**kwargs), name, dim=dim)
        for name, (build, kwargs, dim) in INNER.items()
    }


@pytest.fixture(scope="module")
def training_crops() -> torch.Tensor:
    """Crops the calibration never saw: another seed, at the base config's 128 px crop size."""
    return as_float_images(calibration_views(SAMPLE_IMAGES, 128, views=4, seed=123)[10:])


def _close(measured: FeatureStatistics, target: FeatureStatistics, rel: float) -> None:
    assert measured.std == pytest.approx(target.std, rel=rel)
    assert measured.mean == pytest.approx(target.mean, rel=rel, abs=rel * target.std)
    assert measured.channel_mean == pytest.approx(target.channel_mean, rel=rel)
    assert measured.channel_std == pytest.approx(target.channel_std, rel=rel)


@pytest.mark.parametrize("name", list(INNER))
def test_calibration_views_have_table7_statistics_exactly(rescaled, name):
    teacher = rescaled[name]
    views = calibration_views(SAMPLE_IMAGES, teacher.resolution, views=8, seed=0)
    features = teacher(as_float_images(views)).features
    assert features.shape[-1] == teacher.feature_dim == INNER[name][2]
    _close(feature_statistics(features), TABLE7[name], rel=1e-4)


def test_unseen_crops_keep_the_papers_imbalance(rescaled, training_crops):
    measured = {
        name: feature_statistics(t(resize_view(training_crops, t.resolution)).features)
        for name, t in rescaled.items()
    }
    for name, stats in measured.items():
        _close(stats, TABLE7[name], rel=0.15)
    # PHI-S section 1: "SAM's distribution has a standard deviation that is 191x larger than
    # that of DFN CLIP".
    ratio = measured["sam"].std / measured["dfn_clip"].std
    assert ratio == pytest.approx(191, rel=0.15)


def test_the_map_is_a_fixed_seeded_affine_map_of_the_inner_features(rescaled, training_crops):
    inner = rescaled["dinov2"].teacher
    again = RescaledTeacher(inner, "dinov2", dim=64)
    other_seed = RescaledTeacher(inner, "dinov2", dim=64, seed=1)
    crops = resize_view(training_crops[:4], inner.resolution)
    torch.testing.assert_close(again(crops).features, rescaled["dinov2"](crops).features)
    assert not torch.allclose(other_seed(crops).features, again(crops).features)
    # Affine in the inner features, so the student can learn it exactly.
    x = inner(crops).features
    y = x @ again.weight.T + again.bias
    torch.testing.assert_close(again(crops).features, y)
    torch.testing.assert_close(again(crops).summary, inner(crops).summary)
    # Building the teacher leaves the global RNG alone (configs stay reproducible).
    state = torch.random.get_rng_state()
    RescaledTeacher(inner, "dinov2", dim=64)
    assert torch.equal(state, torch.random.get_rng_state())


def test_too_few_channels_for_the_table7_extremes_is_a_clear_error():
    # SAM: a channel with mean -62.03 and one with std 31.61 need at least 235 channels for
    # the global std 5.4688 (worked out by hand: 7.265 + 5308 / C <= 29.91).
    with pytest.raises(ValueError, match=r"dim=128 .* use dim >= 235"):
        RescaledTeacher(tiny_sam_teacher(resolution=64), "sam", dim=128)
    with pytest.raises(ValueError, match="unknown preset 'clip'"):
        RescaledTeacher(tiny_sam_teacher(resolution=64), "clip")
    with pytest.raises(ValueError, match="global mean"):
        FeatureStatistics(mean=5.0, std=1.0, channel_mean=(-1.0, 1.0), channel_std=(0.5, 2.0))


def test_calibration_views_follow_the_folders_files(tmp_path):
    """The crops are made once per process for the same files: a copy each time, equal to a
    fresh one; a file rewritten since gives crops of the new image."""
    from PIL import Image

    for index, name in enumerate(["a.png", "b.png"]):
        Image.new("RGB", (40, 30), (60 * index, 90, 200)).save(tmp_path / name)
    first = calibration_views(str(tmp_path), 16, views=2, seed=0)
    first.zero_()  # the caller's copy
    again = calibration_views(str(tmp_path), 16, views=2, seed=0)
    assert again.shape == (4, 3, 16, 16) and again.any()
    Image.new("RGB", (40, 30), (255, 0, 0)).save(tmp_path / "a.png")
    os.utime(tmp_path / "a.png", ns=(1, 1))  # a modification time of its own
    changed = calibration_views(str(tmp_path), 16, views=2, seed=0)
    assert not torch.equal(changed[0], again[0]) and torch.equal(changed[1], again[1])
