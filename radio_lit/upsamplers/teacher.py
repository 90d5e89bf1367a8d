"""UpsampledTeacher: a teacher whose dense features come ``k`` times denser from a trained
FeatSharp upsampler (C-RADIOv4 report 2.2: SigLIP2-g-384's 24x24 map as 72x72 for the
512-1152 px student resolutions; notes 4.1).

It is a :class:`~radio_lit.teachers.Teacher` like any other, so any partition, the cache and
the losses take it unchanged. Its view size follows the student's grid: from
``min_student_grid`` tokens a side up it sees ``k R`` px and returns the upsampled map
``[B, k h, k w, C]`` in the teacher's space (the summary from the low-resolution pass, as
FeatSharp leaves it); below, it is the plain teacher at ``R`` px (the report's raw outputs in
the low-resolution partition).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from radio_lit.core.outputs import TeacherOutput
from radio_lit.data.image_folder import SAMPLE_IMAGES
from radio_lit.teachers import Teacher
from radio_lit.teachers.rescaled import calibration_features
from radio_lit.upsamplers.featsharp import FeatSharp
from radio_lit.upsamplers.module import TEACHER_WEIGHTS, UpsamplerFactory

__all__ = ["UpsampledTeacher"]


class UpsampledTeacher(Teacher):
    """``teacher`` with its features upsampled by a trained :class:`FeatSharp` (module docstring).

    Args:
        teacher: the frozen teacher the upsampler was trained for.
        upsampler: the upsampler's architecture, as in the ``configs/featsharp/`` config that
            trained it (its ``init_args``: factor, parts).
        checkpoint: a checkpoint of ``radio-lit fit --config configs/featsharp/...`` (its
            ``upsampler.*`` weights and normalizer; a random-weight teacher's weights too, if
            it kept them). ``None``: an untrained upsampler (zero bias, the image-guided
            joint-bilateral upsampling of the teacher's map, the fusion block starting next to
            the identity) whose normalizer is fitted on the teacher's features of
            ``calibration_views`` views of each shipped photograph [choice]: a baseline, and
            what the tests build.
        min_student_grid: the smallest student grid side (tokens) that gets the upsampled map;
            smaller grids get the plain teacher [choice: C-RADIOv4's high partition, 512 px
            and up, is 32 tokens a side and up].
        calibration_views: see ``checkpoint``.
        trained_by: the config that trains ``checkpoint`` (e.g.
            ``configs/featsharp/quickstart.yaml``), named in the error when it is missing.
    """

    def __init__(
        self,
        teacher: Teacher,
        upsampler: UpsamplerFactory = FeatSharp,
        checkpoint: str | None = None,
        min_student_grid: int = 1,
        calibration_views: int = 4,
        trained_by: str | None = None,
    ) -> None:
        built = upsampler(teacher.feature_dim, teacher.grid_size)
        factor = built.factor
        super().__init__(teacher.resolution * factor, teacher.patch_size, teacher.mean, teacher.std)
        self.teacher = teacher
        self.upsampler = built
        self.factor = factor
        self.min_student_grid = min_student_grid
        self.interpolatable = teacher.interpolatable  # type: ignore[misc]
        self.checkpoint = checkpoint
        self.trained_by = trained_by
        if checkpoint is not None:
            self._load(checkpoint)
        else:
            features = calibration_features(teacher, SAMPLE_IMAGES, calibration_views, seed=0)
            self.upsampler.normalizer.update(features)
            self.upsampler.normalizer.fit()
        self.freeze()

    def _load(self, checkpoint: str) -> None:
        key = "init_args.checkpoint"
        if not os.path.isfile(checkpoint):
            config = self.trained_by or "configs/featsharp/<teacher>.yaml"
            raise FileNotFoundError(
                f"{key}: no upsampler checkpoint at {checkpoint}; train it first with "
                f"radio-lit fit --config {config} (or give null for an untrained one)"
            )
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        state = {
            k.removeprefix("upsampler."): v
            for k, v in saved.get("state_dict", {}).items()
            if k.startswith("upsampler.")
        }
        try:
            self.upsampler.load_state_dict(state)
        except RuntimeError as error:
            raise ValueError(
                f"{key}: {checkpoint} holds no upsampler of this architecture "
                f"({str(error).splitlines()[0]}); give the upsampler init_args it was trained "
                "with, for this teacher"
            ) from error
        if TEACHER_WEIGHTS in saved:
            nn.Module.load_state_dict(self.teacher, saved[TEACHER_WEIGHTS])
        if not self.upsampler.normalizer.is_fitted:
            raise ValueError(
                f"{key}: {checkpoint} was saved before its teacher statistics were estimated"
            )

    @property
    def feature_dim(self) -> int:
        return self.teacher.feature_dim

    @property
    def summary_dim(self) -> int | None:
        return self.teacher.summary_dim

    def upsamples(self, student_grid: tuple[int, int]) -> bool:
        """Whether a student grid gets the upsampled map."""
        return min(student_grid) >= self.min_student_grid

    def view_size(self, student_grid: tuple[int, int]) -> tuple[int, int]:
        """``k R`` px from ``min_student_grid`` up, else the teacher's ``R``."""
        if self.upsamples(student_grid):
            return self.resolution, self.resolution
        return self.teacher.resolution, self.teacher.resolution

    def shares_canvas(self, size: tuple[int, int]) -> bool:
        return self.teacher.shares_canvas(size)

    @torch.no_grad()
    def forward(self, crop: Tensor, size: tuple[int, int] | None = None) -> TeacherOutput:
        """Crop ``[B, 3, h, w]`` in ``[0, 1]`` -> the upsampled output for a ``k R`` px view
        (the default), the teacher's own for an ``R`` px view."""
        size = tuple(size or (self.resolution, self.resolution))
        low = (self.teacher.resolution, self.teacher.resolution)
        if size == low:
            return self.teacher(crop, size)
        if size != (self.resolution, self.resolution):
            raise ValueError(
                f"UpsampledTeacher: views are {low} px (the teacher) or "
                f"{(self.resolution, self.resolution)} px (upsampled {self.factor}x), not {size}"
            )
        return self.upsampler.upsample(self.teacher, crop)

    def encode(self, view: Tensor) -> TeacherOutput:
        """A ``k R`` px view normalized with the teacher's mean/std -> the upsampled output."""
        mean = torch.tensor(self.mean, device=view.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=view.device).view(1, 3, 1, 1)
        return self.upsampler.upsample(self.teacher, (view.float() * std + mean).clamp(0, 1))

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``model.compile``: the wrapped teacher's encoder (the upsampler runs eagerly)."""
        self.teacher.compile(*args, **kwargs)
