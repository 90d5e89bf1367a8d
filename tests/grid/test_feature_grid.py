"""Grid policies (AM-RADIO 4, PHI-S 3, RADIOv2.5 4.2) and antialiased resampling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radio_lit.geometry.grid import check_policies, loss_grid, resample
from radio_lit.normalizers import PhiS
from tests.builders import tiny_module

STUDENT, CLIP = (16, 16), (27, 27)  # ViT/16 at 256 px vs ViT/14 at 378 px


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("teacher", CLIP), ("student", STUDENT), ("larger", CLIP)],
)
def test_each_paper_picks_its_grid(policy, expected):
    assert loss_grid(policy, STUDENT, CLIP) == expected


def test_larger_is_per_axis_and_sam_always_keeps_its_grid():
    assert loss_grid("larger", (64, 16), (27, 27)) == (64, 27)
    for policy in ("teacher", "student", "larger"):
        assert loss_grid(policy, (27, 27), (16, 16), interpolatable=False) == (16, 16)


def test_shrinking_sends_gradient_to_every_student_token():
    """64x64 -> 16x16: plain bilinear reads 2x2 of every 4x4 block (25% of the tokens);
    the antialiased filter reads them all."""
    student = torch.randn(2, 64, 64, 8, requires_grad=True)
    resample(student, (16, 16)).square().sum().backward()
    assert bool((student.grad != 0).all())

    plain = torch.randn(2, 8, 64, 64, requires_grad=True)
    F.interpolate(plain, size=(16, 16), mode="bilinear").square().sum().backward()
    assert (plain.grad != 0).float().mean().item() == pytest.approx(0.25)


def test_shrinking_is_the_widened_triangle_filter_and_growing_is_bilinear():
    # Factor 2: output cell j reads cells 2j-1 .. 2j+2 with weights 1/8, 3/8, 3/8, 1/8 (the
    # bilinear kernel widened 2x); at the borders the missing tap is dropped and the rest
    # renormalized. On the ramp 0..7: [(3*1 + 2) / 7, 2.5, 4.5, (5 + 18 + 21) / 7].
    ramp = torch.arange(8.0).reshape(1, 1, 8, 1).expand(1, 3, 8, 1)
    expected = torch.tensor([5 / 7, 2.5, 4.5, 44 / 7]).reshape(1, 1, 4, 1).expand(1, 3, 4, 1)
    torch.testing.assert_close(resample(ramp, (3, 4)), expected)
    small = torch.randn(1, 16, 16, 3)
    grown = F.interpolate(small.permute(0, 3, 1, 2), size=(27, 27), mode="bilinear")
    torch.testing.assert_close(resample(small, (27, 27)), grown.permute(0, 2, 3, 1))
    assert resample(small, (16, 16)) is small


@pytest.mark.parametrize(("policy", "clip_grid"), [("teacher", 4), ("student", 8), ("larger", 8)])
def test_statistics_and_loss_use_the_policy_grid(policy, clip_grid):
    """A 128 px student (8x8) against 4x4 CLIP/DINOv2 grids; SAM keeps its own 4x4 grid."""
    module = tiny_module(student_resolution=128, grid_policy=policy, normalizer=PhiS)
    module.estimate_statistics = module.refit_statistics = True
    crop = torch.rand(2, 3, 96, 96)
    (chunk,) = module.partitions.chunks(crop, train=True)
    outputs = module.chunk_teachers(crop, chunk)
    (targets,) = module.normalized_targets([outputs])
    matches = module.match(crop, outputs, targets)
    for name, grid in {"clip": clip_grid, "dino": clip_grid, "sam": 4}.items():
        assert targets[name].shape[1:3] == (grid, grid)
        assert matches[name].features.shape == targets[name].shape
        assert module.normalizers[name].count.item() == 2 * grid * grid


def test_a_policy_that_would_resample_sam_is_refused():
    with pytest.raises(ValueError, match="grid_policy_overrides.sam"):
        tiny_module(grid_policy_overrides={"sam": "student"})
    with pytest.raises(ValueError, match="unknown teachers"):
        tiny_module(grid_policy_overrides={"siglip": "student"})
    with pytest.raises(ValueError, match="grid_policy"):
        check_policies("nearest", {}, {"clip": True})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [(3, 5), (9, 4)], ids=["shrink", "grow_and_shrink"])
def test_half_precision_maps_resample_on_a_cpu(dtype, size):
    """``bf16-mixed`` on a CPU: the teachers' and the heads' half-precision maps reach the loss
    grid although PyTorch's CPU antialiased kernel has no half version (computed in float32,
    returned in the map's dtype, gradients through)."""
    features = torch.randn(2, 6, 6, 4).to(dtype).requires_grad_()
    out = resample(features, size)
    assert out.dtype == dtype and out.shape == (2, *size, 4)
    torch.testing.assert_close(out, resample(features.detach().float(), size).to(dtype))
    out.float().sum().backward()
    assert features.grad is not None and features.grad.dtype == dtype
