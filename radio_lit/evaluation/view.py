"""The model view every measure evaluates: images in ``[0, 1]`` -> backbone and teacher outputs.

The same measures run inside training (on a :class:`~radio_lit.module.DistillationModule`,
through its student, adaptor heads and normalizer inverses) and on an exported model
(``radio_lit.load(path)``), because both are seen through :class:`ModelView`: a callable
taking images ``[B, 3, H, W]`` in ``[0, 1]`` (already at the resolution the student should
see) and returning ``{"backbone": TeacherOutput, <teacher>: TeacherOutput, ...}`` with each
teacher's estimate in that teacher's own space (the inference output agreed in BRIEF.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from radio_lit.data.views import normalize_view, resize_view
from radio_lit.teachers import Teacher, TeacherOutput

if TYPE_CHECKING:
    from collections.abc import Iterator

    from radio_lit.module import DistillationModule

#: images ``[B, 3, H, W]`` in ``[0, 1]`` -> ``{"backbone" | teacher: TeacherOutput}``
ModelOutputs = Callable[[Tensor], dict[str, TeacherOutput]]

BACKBONE = "backbone"


@dataclass
class ModelView:
    """A student seen by the measures: its outputs at a chosen resolution, and its teachers.

    Attributes:
        model: images ``[B, 3, H, W]`` in ``[0, 1]`` -> ``{"backbone": TeacherOutput(summary
            [B, D], features [B, h, w, D]), <teacher>: TeacherOutput(summary [B, C_s] | None,
            features [B, h, w, C])}``; the student runs at the images' own size.
        resolution: ``(H, W)`` the student is evaluated at unless a measure says otherwise.
        patch_size: student pixels per feature cell (resolutions are multiples of it).
        teachers: the frozen teachers by name, for the measures that compare with them
            (zero-shot, mode switching, the teacher column of the PCA images); may be empty.
    """

    model: ModelOutputs
    resolution: tuple[int, int]
    patch_size: int
    teachers: Mapping[str, Teacher] = field(default_factory=dict)

    @torch.no_grad()
    def __call__(
        self, images: Tensor, resolution: int | tuple[int, int] | None = None
    ) -> dict[str, TeacherOutput]:
        """Student outputs for ``images [B, 3, h, w]`` in ``[0, 1]`` resized to ``resolution``
        (default :attr:`resolution`; antialiased bilinear)."""
        size = self.resolution if resolution is None else _pair(resolution)
        if size[0] % self.patch_size or size[1] % self.patch_size:
            raise ValueError(
                f"evaluation resolution {size} is not a multiple of the student's patch size "
                f"{self.patch_size}; pick resolutions divisible by {self.patch_size}"
            )
        return self.model(resize_view(images, size))

    @torch.no_grad()
    def teacher_outputs(
        self, images: Tensor, names: Sequence[str] | None = None
    ) -> dict[str, TeacherOutput]:
        """The teachers ``names`` (default all) on their own views of ``images [B, 3, h, w]``
        in ``[0, 1]``."""
        names = list(self.teachers) if names is None else names
        return {name: self.teachers[name](images) for name in names}

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters (CPU for a parameterless callable)."""
        if isinstance(self.model, nn.Module):
            for param in self.model.parameters():
                return param.device
        for teacher in self.teachers.values():
            for param in teacher.parameters():
                return param.device
        return torch.device("cpu")


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def module_view(module: DistillationModule) -> ModelView:
    """The :class:`ModelView` of a DistillationModule: student, heads and normalizer inverses.

    ``backbone`` is the student's first summary token ``[B, D]`` and its patch features
    ``[B, h, w, D]``; each teacher's entry is what :meth:`DistillationModule.predict_step`
    returns (features denormalized by the teacher's normalizer, PHI-S 2.2). Its teachers are
    the module's live ones (none in a run from a cache, :class:`radio_lit.cache.CachedTeacher`).
    """

    def outputs(images: Tensor) -> dict[str, TeacherOutput]:
        view = normalize_view(images, *module.conditioner.values)
        student = module.student(view)
        estimates = {BACKBONE: TeacherOutput(student.summary[:, 0], student.features)}
        for name, heads in module.heads.items():
            summary = None
            if heads.summary is not None:
                summary = heads.summary(student.summary[:, module.summary_token[name]])
            features = module.normalizers[name].inverse(heads.features(student.features))
            estimates[name] = TeacherOutput(summary=summary, features=features)
        return estimates

    return ModelView(
        model=outputs,
        resolution=module.student_resolution,
        patch_size=module.student.patch_size,
        teachers={name: t for name, t in module.teachers.items() if t.live},
    )


@contextmanager
def evaluation_mode(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode (deterministic CPE, no dropout) for the block, then back."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)
