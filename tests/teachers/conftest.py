"""Fixtures: tiny teachers (see ``tests/teachers/tiny.py``) and a shared crop batch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from radio_lit.teachers import Teacher
from tests.teachers.tiny import (
    tiny_clip_teacher,
    tiny_dinov2_teacher,
    tiny_dinov3_teacher,
    tiny_hf_dinov2_teacher,
    tiny_hf_siglip_teacher,
    tiny_sam3_teacher,
    tiny_sam_teacher,
    tiny_siglip_teacher,
)

TINY_BUILDERS: dict[str, Callable[[], Teacher]] = {
    "clip": tiny_clip_teacher,
    "siglip": tiny_siglip_teacher,
    "dinov2_timm": tiny_dinov2_teacher,
    "dinov2_hf": tiny_hf_dinov2_teacher,
    "sam": tiny_sam_teacher,
    "dinov3_timm": tiny_dinov3_teacher,
    "siglip_hf": tiny_hf_siglip_teacher,
    "sam3_hf": tiny_sam3_teacher,
}


@pytest.fixture(params=sorted(TINY_BUILDERS))
def tiny_teacher(request: pytest.FixtureRequest) -> Teacher:
    """Each tiny teacher in turn."""
    torch.manual_seed(0)
    return TINY_BUILDERS[request.param]()


@pytest.fixture
def crop() -> Tensor:
    """Shared crop ``[2, 3, 70, 90]`` in ``[0, 1]``, not the size of any teacher's view."""
    return torch.rand(2, 3, 70, 90, generator=torch.Generator().manual_seed(0))
