"""Frozen bf16 teachers run in their own dtype, without the float32 islands of a surrounding
``bf16-mixed`` autocast (README "Teachers on a GPU"), one family of each library.

On a CPU, CUDA autocast is seen on fake CUDA tensors (``benchmarks/fake_cuda.py``): the CUDA
dispatch keys, autocast's included, without a GPU. On a GPU, the features are compared.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.fake_cuda import FakeCuda
from tests.teachers.tiny import (
    tiny_clip_teacher,
    tiny_dinov2_teacher,
    tiny_hf_siglip_teacher,
    tiny_sam_teacher,
)

FAMILIES = {
    "open_clip": tiny_clip_teacher,
    "timm": tiny_dinov2_teacher,
    "segment_anything": tiny_sam_teacher,
    "transformers": tiny_hf_siglip_teacher,
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_bf16_teacher_ignores_bf16_mixed_autocast(family: str) -> None:
    """Under CUDA bf16 autocast (Lightning's ``bf16-mixed``) a bf16 teacher dispatches exactly
    what it dispatches without it: its layer norms return bf16, and its only casts are its view
    to bf16, its outputs to float32 and what its library casts itself. Its encoder called
    directly under autocast (the former path) runs every layer norm as a float32 island."""
    torch.manual_seed(0)
    teacher = FAMILIES[family](dtype="bfloat16")
    side = teacher.resolution
    with FakeCuda() as fake:
        state = fake.state(teacher)
        crop = fake.empty(2, 3, side, side)
        out, under = fake.run(teacher, state, (crop, (side, side)), autocast=True, warm=True)
        _, without = fake.run(teacher, state, (crop, (side, side)), autocast=False)
        view = fake.empty(2, 3, side, side, dtype=torch.bfloat16)
        _, islands = fake.run(teacher, state, (view,), autocast=True, fn=teacher.encode)
    assert under.ops == without.ops
    assert set(under.norm_dtypes) == {torch.bfloat16}
    assert out.features.dtype == torch.float32 and out.features.device.type == "cuda"
    assert set(islands.norm_dtypes) == {torch.float32}
    # each float32 island casts its input, weight and bias to float32 (and its output back)
    assert islands.casts >= under.casts + 3 * islands.norm_dtypes[torch.float32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bf16_teacher_features_without_autocast_islands_stay_within_bf16_rounding(family):
    """On a GPU: outputs under ``bf16-mixed`` autocast equal those without it (the teacher
    disables it), and differ from the former float32-island path by at most the rounding of
    the final norm's output to bf16 (relative 2^-9 per element; bound 2^-7 on the relative L2
    error for the islands' other outputs, each rounded to bf16 at its next matrix product
    either way)."""
    torch.manual_seed(0)
    teacher = FAMILIES[family](dtype="bfloat16").cuda()
    crop = torch.rand(2, 3, teacher.resolution, teacher.resolution, device="cuda")
    plain = teacher(crop)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        mixed = teacher(crop)
        islands = teacher.encode(teacher.view(crop).to(torch.bfloat16))
    assert torch.equal(plain.features, mixed.features)
    error = (islands.features.float() - plain.features).norm() / islands.features.float().norm()
    assert error < 2**-7
