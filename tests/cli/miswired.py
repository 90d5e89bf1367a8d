"""A custom teacher whose declared feature width is not what its encoder returns."""

from __future__ import annotations

from radio_lit.teachers import DINOv2Teacher


class WideDeclaredTeacher(DINOv2Teacher):
    """A DINOv2 teacher that declares 16 channels more than its encoder returns, the mistake a
    custom teacher's ``feature_dim`` can make (``--model.teachers.dino.class_path
    tests.cli.miswired.WideDeclaredTeacher``)."""

    @property
    def feature_dim(self) -> int:
        return super().feature_dim + 16
