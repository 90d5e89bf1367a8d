"""The student's side of a training step: C-RADIOv4's parts around the student forward
(tech report 2.2-2.4; notes 2.3-2.5; DESIGN.md "Where the next parts go").

:class:`StudentStep` holds the configured parts (``model.shifts``, ``model.damp``,
``model.mesa``) and gives ``DistillationModule`` one call per phase of its step:

1. :meth:`~StudentStep.begin`: the step's draws that every rank shares (the student's
   :meth:`~radio_lit.students.Student.begin_step`: whether a CPE ViT runs ViTDet windows),
   and this rank's own random streams (:mod:`radio_lit.training.random_streams`);
2. each chunk's view shifts (:mod:`radio_lit.geometry.shifts`), drawn from this object's shift
   stream by :func:`radio_lit.training.views.shifted_chunks`;
3. :meth:`~StudentStep.run` / :meth:`~StudentStep.forward`: the student on its (shifted) crop
   of a chunk's images, with DAMP's weight noise in training forwards
   (:mod:`radio_lit.students.damp`);
4. :meth:`~StudentStep.average`: the EMA student on its own shifted crop, for the MESA term
   (:mod:`radio_lit.students.ema`, :func:`radio_lit.training.losses.mesa_term`);
5. :meth:`~StudentStep.follow`: the EMA student follows each optimizer update.

**Per-rank draws.** The draws of 2-4 differ per rank and per image: each rank draws its shifts
(and the EMA's) from its own stream, and runs every training forward of the student with its
own stream in place of torch's default generators, so DAMP's noise (a fresh draw per
sub-batch per device, Trinh et al. 2024), the CPE windows and dropout differ between ranks.
Both streams are seeded from the run's seed and the global rank, and every rank's state is in
each checkpoint (:meth:`~StudentStep.state_dict`): a resumed run draws what the interrupted one
would have. The draws every rank must share (ViTDet on or off, the partitions' resolutions)
stay with the run's seed and step, or torch's global generators.

The student, its heads and the EMA student stay submodules of the LightningModule (their
state-dict keys ``student.*``, ``heads.*``, ``ema.*``; FSDP2 and ``torch.compile`` act on
them there) and are passed to each call; this object holds configuration and random streams.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from radio_lit.data.views import teacher_view
from radio_lit.geometry.shifts import PatchShifts, shifted_view
from radio_lit.students import Student, StudentOutput
from radio_lit.students.conditioner import StudentConditioner
from radio_lit.students.damp import DAMP, weight_noise
from radio_lit.students.ema import MESA, EMAStudent
from radio_lit.students.packing import StudentPacking
from radio_lit.training.partitions import Chunk
from radio_lit.training.random_streams import RankStream, gather_ranks, own_rank

__all__ = [
    "DAMP",
    "MESA",
    "EMAView",
    "PatchShifts",
    "StudentPacking",
    "StudentStep",
    "run_seed",
    "student_shift",
]


#: :class:`~radio_lit.training.random_streams.RankStream` purposes: the student's training forwards
#: (CPE windows, dropout, DAMP's noise) and the view shifts.
FORWARD_STREAM, SHIFT_STREAM = 1, 2


def run_seed() -> int:
    """The run's seed as every rank knows it: ``seed_everything``'s, which Lightning hands to
    every process of a run (``PL_GLOBAL_SEED``; the processes it launches inherit it); 0 when
    the run is not seeded."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def student_shift(chunk: Chunk) -> Tensor | None:
    """The student's view shift of ``chunk`` (``[n, 2]`` tokens, host), or ``None``
    (the whole crop, unshifted: no ``model.shifts``, or evaluation)."""
    return chunk.shifts.student if chunk.shifts is not None else None


@dataclasses.dataclass
class EMAView:
    """The EMA student's output on its own view of a chunk, and that view's shift (``[B, 2]``
    tokens on the host, or ``None``: unshifted)."""

    output: StudentOutput
    shift: Tensor | None


class StudentStep:
    """C-RADIOv4's training parts around the student (module docstring).

    Args:
        patch: the student's patch size.
        resolution: ``(H, W)`` the student's default view size.
        conditioner: the student's pixel mean and std (the run's state, restored on resume).
        shifts: shift-equivariant views (report 2.3.1); ``None``: unshifted.
        damp: weight noise in training forwards (report 2.4); ``None``: off.
        mesa: the EMA student's MESA term (report 2.3.2); ``None``: no EMA.
        packing: a step's chunks in one packed student forward (docs/c-radio.md;
            :class:`~radio_lit.students.packing.StudentPacking`); ``None``: one per chunk.
    """

    def __init__(
        self,
        patch: int,
        resolution: tuple[int, int],
        conditioner: StudentConditioner,
        shifts: PatchShifts | None = None,
        damp: DAMP | None = None,
        mesa: MESA | None = None,
        packing: StudentPacking | None = None,
    ) -> None:
        self.patch = patch
        self.resolution = resolution
        self.conditioner = conditioner
        self.shifts = shifts
        self.damp = damp
        self.mesa = mesa
        self.packing = packing
        self.margin = shifts.margin if shifts is not None else 0.0
        self.streams = {"forward": RankStream(FORWARD_STREAM), "shifts": RankStream(SHIFT_STREAM)}
        #: Whether this step's trunk gradients are dropped (set before each step by
        #: :class:`~radio_lit.callbacks.FreezeBody`): the EMA then holds the trunk's average
        #: (:meth:`follow`) and MESA's backbone-only term is skipped (:meth:`average`).
        self.trunk_frozen = False

    def begin(self, student: Student, step: int, rank: int = 0) -> None:
        """Before training step ``step`` (the optimizer step, restored on resume) on global
        rank ``rank``: the student's per-step draws, from the run's seed and ``step`` only
        (:func:`run_seed`), hence the same on every rank with no collective and the same after
        a resume; and this rank's streams, seeded once from the run's seed and ``rank``."""
        student.begin_step(run_seed(), step)
        for stream in self.streams.values():
            stream.start(run_seed(), rank)

    def run(
        self,
        student: Student,
        crop: Tensor,
        resolution: tuple[int, int] | None = None,
        shift: Tensor | None = None,
        training: bool = False,
    ) -> StudentOutput:
        """``student`` on its view of ``crop [B, 3, S, S]`` at ``resolution`` (default: the
        student's): with ``shift [B, 2]`` (host; zeros allowed), the crop's shared region
        moved by that many whole patches (:func:`~radio_lit.geometry.shifts.shifted_view`), else the
        whole crop; with this rank's forward stream and DAMP's weight noise when
        ``training``."""
        view = self.view(crop, resolution, shift)
        if not training:
            return student(view)
        with self.streams["forward"].active(view.device), weight_noise(self.damp, student, True):
            return student(view)

    def view(
        self, crop: Tensor, resolution: tuple[int, int] | None, shift: Tensor | None
    ) -> Tensor:
        """The student's normalized view ``[B, 3, H, W]`` of ``crop`` (:meth:`run`)."""
        size = resolution or self.resolution
        margin = self.margin if shift is not None else 0.0
        mean, std = self.conditioner.values
        return teacher_view(shifted_view(crop, size, margin, shift, self.patch), size, mean, std)

    def state_dict(self) -> list[dict[str, Any]]:
        """Every rank's stream states, in rank order (every rank calls it together:
        :func:`~radio_lit.training.random_streams.gather_ranks`)."""
        return gather_ranks({name: s.state_dict() for name, s in self.streams.items()})

    def load_state_dict(
        self, ranks: list[dict[str, Any]] | None, world_size: int, rank: int
    ) -> None:
        """This rank's stream states from :meth:`state_dict`'s ``ranks`` (kept fresh, with a
        warning, from a checkpoint of another rank count; nothing in one written before)."""
        state = own_rank(ranks, world_size, rank, "random streams")
        for name, stream in self.streams.items():
            if state is not None and name in state:
                stream.load_state_dict(state[name])

    def save_streams(self, checkpoint: dict[str, Any]) -> None:
        """``checkpoint["random_streams"]``: every rank's stream states (:meth:`state_dict`;
        ``LightningModule.on_save_checkpoint``, which every rank runs)."""
        checkpoint["random_streams"] = self.state_dict()

    def load_streams(self, checkpoint: dict[str, Any], trainer: Any) -> None:
        """This rank's streams from ``checkpoint`` (``on_load_checkpoint``; ``trainer`` gives the
        rank, ``None`` outside a ``Trainer``: rank 0 of 1)."""
        world, rank = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
        self.load_state_dict(checkpoint.get("random_streams"), world, rank)

    def forward(
        self, student: Student, chunks: Sequence[Chunk], training: bool
    ) -> list[StudentOutput]:
        """``student`` on each chunk's view (:meth:`run`: at the chunk's resolution, shifted by
        its student shift, with DAMP's noise when ``training``), one output per chunk.

        With :attr:`packing` and several chunks, one packed forward over all their views
        (:class:`~radio_lit.students.packing.StudentPacking`): the same outputs, each chunk's
        unpacked to its own tensors, so the losses are unchanged; DAMP then draws one noise
        for the packed forward instead of one per chunk."""
        if self.packing is None or len(chunks) < 2:
            return [
                self.run(student, c.crop, c.resolution, student_shift(c), training) for c in chunks
            ]
        views = [self.view(c.crop, c.resolution, student_shift(c)) for c in chunks]
        kernel = self.packing.kernel_for(student, views[0].device)
        if not training:
            return student(views, kernel)
        device = views[0].device
        with self.streams["forward"].active(device), weight_noise(self.damp, student, True):
            return student(views, kernel)

    def average(self, ema: EMAStudent | None, chunks: Sequence[Chunk]) -> list[EMAView] | None:
        """The EMA student on each chunk's view, without gradient, for the MESA term (report
        2.3.2; :func:`radio_lit.training.losses.mesa_term`); ``None`` without the EMA, with
        MESA's weight 0, or on a step whose trunk is held (:attr:`trunk_frozen`) when MESA
        applies to the backbone only: its whole gradient would reach the trunk, and be dropped
        ``[choice]`` (with ``heads`` or ``both`` the heads, which train, get it: it runs).

        Each chunk's EMA student sees its own view: its own shift, drawn like the student's
        from this rank's shift stream (unshifted without ``model.shifts`` or with the
        student's view unshifted)."""
        if self.mesa is None or ema is None or not self.mesa.weight > 0:
            return None
        if self.trunk_frozen and self.mesa.applies_to == "backbone":
            return None
        views = []
        for chunk in chunks:
            shift = None
            if self.shifts is not None:  # its own crop of the shared region (zeros: unshifted)
                shift = torch.zeros(chunk.crop.shape[0], 2, dtype=torch.long)
                if self.shifts.student:
                    with self.streams["shifts"].active(torch.device("cpu")):
                        draws = self.shifts.draw(chunk.crop.shape[0])
                    size = (chunk.resolution, self.patch)
                    shift = self.shifts.within_margin(draws, size, "EMA")
            with torch.no_grad():
                output = self.run(ema.student, chunk.crop, chunk.resolution, shift)
            views.append(EMAView(output, shift))
        return views

    def follow(self, ema: EMAStudent | None, student: nn.Module, heads: nn.Module) -> None:
        """After each optimizer update (not per accumulated batch; the last one included):
        the EMA student follows the live student and heads (report 2.3.2); on a step whose
        trunk is held (:attr:`trunk_frozen`) the heads only, the trunk's average held
        (:meth:`~radio_lit.students.ema.EMAStudent.update`) ``[choice]``."""
        if ema is not None:
            ema.update(student, heads, trunk=not self.trunk_frozen)
