"""The student's side of a training step: C-RADIOv4's parts around the student forward
(tech report 2.2-2.4; notes 2.3-2.5; DESIGN.md "Where the next parts go").

:class:`StudentStep` holds the configured parts (``model.shifts``, ``model.damp``,
``model.mesa``) and gives ``DistillationModule`` one call per phase of its step:

1. :meth:`~StudentStep.begin`: the step's draws that every rank shares (the student's
   :meth:`~radio_lit.students.Student.begin_step`: whether a CPE ViT runs ViTDet windows);
2. :meth:`~StudentStep.views`: each chunk's view shifts (:mod:`radio_lit.shifts`);
3. :meth:`~StudentStep.run`: the student on its (shifted) view of a chunk's crop, with
   DAMP's weight noise in training forwards (:mod:`radio_lit.students.damp`);
4. :meth:`~StudentStep.add_mesa`: the MESA term, the EMA student on its own shifted view
   (:mod:`radio_lit.students.ema`);
5. :meth:`~StudentStep.follow`: the EMA student follows each optimizer update.

The student, its heads and the EMA student stay submodules of the LightningModule (their
state-dict keys ``student.*``, ``heads.*``, ``ema.*``; FSDP2 and ``torch.compile`` act on
them there) and are passed to each call; this object holds configuration only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from radio_lit.data.views import resize_view, teacher_view
from radio_lit.partitions import Chunk
from radio_lit.shifts import PatchShifts, shift_view
from radio_lit.students import Student, StudentOutput, TeacherHeads
from radio_lit.students.damp import DAMP, weight_noise
from radio_lit.students.ema import MESA, EMAStudent, mesa_loss

__all__ = ["DAMP", "MESA", "PatchShifts", "StudentStep", "run_seed", "student_shift"]

Triple = tuple[float, float, float]


def run_seed() -> int:
    """The run's seed as every rank knows it: ``seed_everything``'s, which Lightning hands to
    every process of a run (``PL_GLOBAL_SEED``; the processes it launches inherit it); 0 when
    the run is not seeded."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def student_shift(chunk: Chunk) -> Tensor | None:
    """The student's view shift of ``chunk`` (``[n, 2]`` tokens), or ``None`` (unshifted)."""
    return chunk.shifts.student if chunk.shifts is not None else None


class StudentStep:
    """C-RADIOv4's training parts around the student (module docstring).

    Args:
        resolution: ``(H, W)`` the student's default view size.
        mean: the student's pixel mean (also the fill of a shifted view's border).
        std: the student's pixel std.
        shifts: shift-equivariant views (report 2.3.1); ``None``: unshifted.
        damp: weight noise in training forwards (report 2.4); ``None``: off.
        mesa: the EMA student's MESA term (report 2.3.2); ``None``: no EMA.
    """

    def __init__(
        self,
        resolution: tuple[int, int],
        mean: Triple,
        std: Triple,
        shifts: PatchShifts | None = None,
        damp: DAMP | None = None,
        mesa: MESA | None = None,
    ) -> None:
        self.resolution = resolution
        self.mean = mean
        self.std = std
        self.shifts = shifts
        self.damp = damp
        self.mesa = mesa

    def begin(self, student: Student, step: int) -> None:
        """Before training step ``step`` (the optimizer step, restored on resume): the
        student's per-step draws, from the run's seed and ``step`` only (:func:`run_seed`),
        hence the same on every rank with no collective and the same after a resume."""
        student.begin_step(run_seed(), step)

    def views(self, chunks: Sequence[Chunk], live: bool) -> list[Chunk]:
        """The training step's ``chunks`` with their view shifts (drawn per chunk, the student
        first, then each teacher; :meth:`~radio_lit.shifts.PatchShifts.chunk_shifts`). Only
        ``live`` teachers are shifted: a cached teacher's outputs are of its unshifted view."""
        if self.shifts is None:
            return list(chunks)
        return [
            dataclasses.replace(
                chunk,
                shifts=self.shifts.chunk_shifts(
                    chunk.crop.shape[0], chunk.teachers if live else (), chunk.crop.device
                ),
            )
            for chunk in chunks
        ]

    def run(
        self,
        student: Student,
        crop: Tensor,
        resolution: tuple[int, int] | None = None,
        shift: Tensor | None = None,
        training: bool = False,
    ) -> StudentOutput:
        """``student`` on its view of ``crop [B, 3, S, S]`` at ``resolution`` (default: the
        student's), shifted by ``shift [B, 2]`` whole patches; with DAMP's weight noise when
        ``training``."""
        size = resolution or self.resolution
        if shift is not None:
            crop = shift_view(resize_view(crop, size), shift, student.patch_size, self.mean)
        view = teacher_view(crop, size, self.mean, self.std)
        with weight_noise(self.damp, student, training):
            return student(view)

    def forward(
        self, student: Student, chunks: Sequence[Chunk], training: bool
    ) -> list[StudentOutput]:
        """``student`` on each chunk's view (:meth:`run`: at the chunk's resolution, shifted by
        its student shift, with DAMP's noise when ``training``), one output per chunk."""
        return [self.run(student, c.crop, c.resolution, student_shift(c), training) for c in chunks]

    def add_mesa(
        self,
        loss: Tensor,
        chunks: Sequence[Chunk],
        online: Sequence[StudentOutput],
        heads: Mapping[str, TeacherHeads],
        ema: EMAStudent | None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``loss`` plus the weighted MESA term of a training step (report 2.3.2), and its log
        ``{"train/mesa_loss": sum_c w_c L_mesa(c)}`` (chunk weights ``w_c`` as the balanced
        loss's); ``(loss, {})`` without the EMA or with weight 0.

        Each chunk's EMA student sees its own view: its own shift, drawn like the student's
        (unshifted without ``model.shifts`` or with the student's view unshifted)."""
        if self.mesa is None or ema is None or not self.mesa.weight > 0:
            return loss, {}
        term = sum(
            chunk.weight * self._mesa_term(chunk, out, heads, ema)
            for chunk, out in zip(chunks, online, strict=True)
        )
        return loss + self.mesa.weight * term, {"train/mesa_loss": term}

    def _mesa_term(
        self,
        chunk: Chunk,
        online: StudentOutput,
        heads: Mapping[str, TeacherHeads],
        ema: EMAStudent,
    ) -> Tensor:
        """One chunk's MESA term: :func:`~radio_lit.students.ema.mesa_loss` of the maps
        ``applies_to`` names."""
        assert self.mesa is not None
        ema_shift = None
        if self.shifts is not None and self.shifts.student:
            ema_shift = self.shifts.draw(chunk.crop.shape[0]).to(chunk.crop.device)
        with torch.no_grad():
            average = self.run(ema.student, chunk.crop, chunk.resolution, ema_shift)
        maps, ema_maps = {}, {}
        if self.mesa.applies_to in ("backbone", "both"):
            maps["backbone"], ema_maps["backbone"] = online.features, average.features
        if self.mesa.applies_to in ("heads", "both"):
            for name in chunk.teachers:
                maps[name] = heads[name].features(online.features)
                with torch.no_grad():
                    ema_maps[name] = ema.heads[name].features(average.features)
        return mesa_loss(maps, ema_maps, student_shift(chunk), ema_shift)

    @staticmethod
    def follow(ema: EMAStudent | None, student: nn.Module, heads: nn.Module) -> None:
        """After each optimizer update (not per accumulated batch; the last one included):
        the EMA student follows the live student and heads (report 2.3.2)."""
        if ema is not None:
            ema.update(student, heads)
