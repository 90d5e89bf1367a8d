"""Mode switching (AM-RADIO figure 4) and scale equivariance (RADIOv2.5 supplement F)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.evaluation import ModelView, ModeSwitching, ScaleEquivariance, scale_variance
from radio_lit.evaluation.resolution import largest_jump
from radio_lit.teachers import TeacherOutput


def test_scale_variance_is_zero_for_exactly_equivariant_features():
    generator = torch.Generator().manual_seed(0)
    small = torch.randn(2, 4, 4, 8, generator=generator)
    # A 2x nearest upsampling is undone exactly by a bilinear 2x downsampling.
    double = small.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
    triple = small.repeat_interleave(3, dim=1).repeat_interleave(3, dim=2)
    values = scale_variance([small, double, triple])
    assert values.shape == (2,)
    torch.testing.assert_close(values, torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)


def test_scale_variance_hand_worked():
    """One channel. F_min = [0, 2]: mean 1, (unbiased) std sqrt(2). F_2 = [0, 0, 4, 4] shrinks
    bilinearly to [0, 4]. Standardized: [-1, 1]/sqrt(2) and [-1, 3]/sqrt(2); the variance
    across the two scales is 0 at the first position and (2/sqrt(2))^2 / 2 = 1 at the second:
    sigma^2_scale = 0.5."""
    f_min = torch.tensor([0.0, 2.0]).reshape(1, 1, 2, 1)
    f_2 = torch.tensor([0.0, 0.0, 4.0, 4.0]).reshape(1, 1, 4, 1)
    assert scale_variance([f_2, f_min]).item() == pytest.approx(0.5, abs=1e-7)


def test_largest_jump():
    assert largest_jump({32: 1.0, 64: 1.1, 96: 3.3, 128: 3.4}) == (96, pytest.approx(3.0))


class ColorFeatures(nn.Module):
    """Features: the image's mean colour on the patch grid; ``+offset`` above ``switch`` px."""

    def __init__(self, switch: int = 10**6, offset: float = 1.0) -> None:
        super().__init__()
        self.switch, self.offset = switch, offset

    def forward(self, images: Tensor) -> dict[str, TeacherOutput]:
        color = images.mean(dim=(2, 3))
        h, w = images.shape[2] // 16, images.shape[3] // 16
        features = color[:, None, None, :].expand(-1, h, w, -1)
        if images.shape[-1] > self.switch:
            features = features + self.offset
        return {"backbone": TeacherOutput(color, features), "dino": TeacherOutput(color, features)}


class ColorTeacher(nn.Module):
    def forward(self, images: Tensor) -> TeacherOutput:
        view = F.interpolate(images, size=(56, 56), mode="bilinear", antialias=True)
        return ColorFeatures()(view)["dino"]


def test_mode_switching_finds_the_resolution_where_the_student_switches():
    view = ModelView(ColorFeatures(switch=96), (64, 64), 16, {"dino": ColorTeacher()})
    measure = ModeSwitching(resolutions=[32, 64, 96, 128, 160], max_images=3, crop_size=160)
    report = measure.evaluate(view)
    curve = report.curves["eval/mode_switching/dino/mse"]
    assert list(curve) == [32, 64, 96, 128, 160]
    assert max(curve[r] for r in (32, 64, 96)) < 1e-4  # colour means agree up to resampling
    assert curve[128] == pytest.approx(1.0, abs=1e-2) and curve[160] == pytest.approx(1.0, abs=1e-2)
    assert report.scalars["eval/mode_switching/dino/jump_resolution"] == 128
    assert report.scalars["eval/mode_switching/dino/jump_ratio"] > 100
    assert "| 128 |" in report.text["eval/mode_switching/dino"]


class PooledPixels(nn.Module):
    """Features: the image average-pooled to the patch grid (nearly scale-equivariant),
    negated above ``switch`` px (a mode switch)."""

    def __init__(self, switch: int = 10**6) -> None:
        super().__init__()
        self.switch = switch

    def forward(self, images: Tensor) -> dict[str, TeacherOutput]:
        features = F.avg_pool2d(images, 16).permute(0, 2, 3, 1)
        if images.shape[-1] > self.switch:
            features = -features
        return {"backbone": TeacherOutput(features.mean(dim=(1, 2)), features)}


def test_scale_equivariance_callback_tells_a_mode_switch_apart():
    measure = ScaleEquivariance(max_images=2)
    steady = measure.evaluate(ModelView(PooledPixels(), (64, 64), 16)).scalars
    switching = measure.evaluate(ModelView(PooledPixels(switch=96), (64, 64), 16)).scalars
    assert set(steady) == {
        "eval/scale_equivariance/backbone/fine",
        "eval/scale_equivariance/backbone/coarse",
    }
    assert steady["eval/scale_equivariance/backbone/fine"] < 0.5  # 1 patch apart: close
    for scale in ("fine", "coarse"):  # fine: 64-128 px, coarse: 64, 128, 192 px
        tag = f"eval/scale_equivariance/backbone/{scale}"
        assert switching[tag] > 10 * steady[tag]
