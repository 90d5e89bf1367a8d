"""The Teacher contract, checked on every tiny teacher: shapes, frozen behaviour, configs."""

from __future__ import annotations

import textwrap

import pytest
import torch
import yaml
from jsonargparse import ArgumentParser
from torch import Tensor, nn

from radio_lit.teachers import DINOv2Teacher, OpenCLIPTeacher, SAMTeacher, Teacher
from tests.teachers.conftest import TINY_BUILDERS
from tests.teachers.tiny import tiny_teacher_configs


def test_output_shapes(tiny_teacher: Teacher, crop: Tensor) -> None:
    out = tiny_teacher(crop)
    side = tiny_teacher.resolution // tiny_teacher.patch_size
    assert tiny_teacher.grid_size == (side, side)
    assert out.features.shape == (2, side, side, tiny_teacher.feature_dim)
    if tiny_teacher.has_summary:
        assert out.summary is not None
        assert out.summary.shape == (2, tiny_teacher.summary_dim)
    else:
        assert out.summary is None and tiny_teacher.summary_dim is None
    assert not out.features.requires_grad


def test_frozen_inside_a_training_parent(tiny_teacher: Teacher) -> None:
    parent = nn.ModuleDict({"teacher": tiny_teacher, "head": nn.Linear(4, 4)})
    parent.train()
    assert parent["head"].training
    assert not any(m.training for m in tiny_teacher.modules())
    assert not any(p.requires_grad for p in tiny_teacher.parameters())
    keys = parent.state_dict().keys()
    assert keys == {"head.weight", "head.bias"}


def test_tiny_teachers_build_from_yaml_through_jsonargparse() -> None:
    teachers_yaml = yaml.safe_dump(tiny_teacher_configs(sam_resolution=96))
    parser = ArgumentParser()
    parser.add_argument("--teachers", type=dict[str, Teacher])
    cfg = parser.parse_string(f"teachers:\n{textwrap.indent(teachers_yaml, '  ')}")
    teachers = parser.instantiate_classes(cfg).teachers
    assert isinstance(teachers["clip"], OpenCLIPTeacher)
    assert isinstance(teachers["dino"], DINOv2Teacher)
    assert isinstance(teachers["sam"], SAMTeacher)
    assert [t.grid_size for t in teachers.values()] == [(4, 4), (4, 4), (6, 6)]


@pytest.mark.parametrize("name", sorted(TINY_BUILDERS))
def test_channels_last_teachers_give_the_same_outputs(name: str, crop: Tensor) -> None:
    """``channels_last: true`` stores every convolution NHWC and leaves the outputs equal."""
    torch.manual_seed(0)
    plain = TINY_BUILDERS[name]()
    torch.manual_seed(0)
    nhwc = TINY_BUILDERS[name](channels_last=True)
    convolutions = [p for p in nhwc.parameters() if p.dim() == 4]
    assert convolutions, "every teacher family has at least its patch embedding"
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in convolutions)
    assert any(not p.is_contiguous() for p in convolutions)  # a 1x1 kernel is both
    expected, actual = plain(crop), nhwc(crop)
    torch.testing.assert_close(actual.features, expected.features, rtol=1e-5, atol=1e-5)
    if expected.summary is not None:
        torch.testing.assert_close(actual.summary, expected.summary, rtol=1e-5, atol=1e-5)
