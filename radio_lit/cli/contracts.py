"""The contracts between a run's parts, checked when the run is built, before its first step.

Each part of a config is valid on its own when it is parsed; what only the built parts can
show is whether they fit together. :func:`check_contracts` checks, once the trainer and the
module exist and before anything trains (``radio-lit fit``, ``validate``, ``test``):

- every evaluation callback (:mod:`radio_lit.evaluation`) reads outputs the model has
  (``backbone`` and its teachers' names), and a summary where it needs one;
- each live teacher's declared ``feature_dim`` / ``summary_dim`` is what its encoder returns
  for one view at its resolution: one teacher forward of one image at build, on the run's
  device (milliseconds for the tiny teachers of the tests; for a large teacher built on the
  CPU, that forward plus one copy of its weights to the device and back, seconds); a teacher
  built on the meta device, or read from a teacher-feature cache, is not run;
- a normalizer (or ``AngleBalanced``'s summary dispersion) that needs teacher statistics has
  a ``TeacherStatsEstimation`` callback to estimate them, unless the run resumes a checkpoint
  that holds them.

A model other than :class:`~radio_lit.module.DistillationModule` (``configs/featsharp/``) is
not checked.

A broken contract is a :class:`~radio_lit.core.errors.ConfigError`: one line, exit status 2,
and the run folder left as it was (:class:`~radio_lit.cli.runs.RunFolderState`), where
before it surfaced as a traceback at the first step or the first evaluation, hours in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from radio_lit.callbacks.statistics import TeacherStatsEstimation
from radio_lit.core.errors import ConfigError
from radio_lit.evaluation.base import Evaluation
from radio_lit.evaluation.view import BACKBONE
from radio_lit.module import DistillationModule
from radio_lit.teachers.base import Teacher


def check_contracts(trainer: pl.Trainer, module: pl.LightningModule, *, resuming: bool) -> None:
    """Raise a :class:`ConfigError` for the first contract the built run breaks."""
    if not isinstance(module, DistillationModule):
        return
    check_evaluations(trainer.callbacks, module.teachers)  # type: ignore[attr-defined]
    check_teacher_widths(module.teachers, trainer.strategy.root_device)
    if not resuming:
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        identity = "use --model.normalizer radio_lit.normalizers.Identity"
        check_statistics(callbacks, module.normalizers, "normalizers", identity)
        fixed = "give fixed ones in --model.summary_loss.dispersion"
        check_statistics(callbacks, module.dispersions, "summary dispersions", fixed)


def check_evaluations(callbacks: list[Any], teachers: Mapping[str, Teacher]) -> None:
    """Every :class:`Evaluation` in ``callbacks`` reads outputs that the model with
    ``teachers`` returns, with a summary where the measure needs one."""
    outputs = [BACKBONE, *teachers]
    for callback in callbacks:
        if not isinstance(callback, Evaluation):
            continue
        name = type(callback).__name__
        for output in callback.outputs_read():
            if output not in outputs:
                raise ConfigError(
                    f"trainer.callbacks: {name} reads output {output!r}, which this model "
                    f"does not have (it has {', '.join(outputs)}): name one of those in "
                    f"{name}'s init_args, or add teacher {output!r} under model.teachers"
                )
            summary = output == BACKBONE or teachers[output].summary_dim is not None
            if callback.reads_summaries and not summary:
                with_summary = [o for o in outputs if o == BACKBONE or teachers[o].summary_dim]
                raise ConfigError(
                    f"trainer.callbacks: {name} reads the summary of {output!r}, a teacher "
                    f"without one: name an output with a summary ({', '.join(with_summary)})"
                )


def check_teacher_widths(teachers: Mapping[str, Teacher], device: torch.device) -> None:
    """Each live teacher's ``feature_dim`` and ``summary_dim`` against one encode of a view
    ``[1, 3, R, R]`` at its resolution ``R``, on ``device`` (the run's: an FP8 teacher runs
    only there), the teacher put back where it was after. The view is drawn from a generator
    of its own (the run's random streams are untouched); the teacher's compilation is
    bypassed."""
    for name, teacher in teachers.items():
        weight = next(teacher.parameters(), None)
        if not teacher.live or (weight is not None and weight.is_meta):
            continue
        home = weight.device if weight is not None else device
        side = teacher.resolution
        crop = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(0))
        teacher.to(device)
        try:
            view = teacher.view(crop.to(device))
            if weight is not None and weight.is_floating_point():
                view = view.to(weight.dtype)
            with torch.no_grad(), torch.autocast(device.type, enabled=False):
                out = teacher.encode(view)
        finally:
            teacher.to(home)
        got = (out.features.shape[-1], None if out.summary is None else out.summary.shape[-1])
        declared = (teacher.feature_dim, teacher.summary_dim)
        names = ("feature_dim", "summary_dim")
        for what, given, returned in zip(names, declared, got, strict=True):
            if given != returned:
                raise ConfigError(
                    f"model.teachers.{name}: {type(teacher).__name__} declares {what} {given} "
                    f"but its encoder returns {returned} (one view of {side}x{side} px): make "
                    f"{what} return what the encoder returns, or give the settings that build "
                    "the encoder it declares"
                )


def check_statistics(
    callbacks: list[Any], statistics: Mapping[str, Any], what: str, instead: str
) -> None:
    """The teacher statistics ``statistics`` (each teacher's normalizer, or its summary
    dispersion under ``AngleBalanced``) that need estimating have a
    :class:`TeacherStatsEstimation` to estimate them; ``instead`` is the other way out."""
    if any(isinstance(c, TeacherStatsEstimation) for c in callbacks):
        return
    needing = {
        name: type(s).__name__
        for name, s in statistics.items()
        if s.requires_statistics and not s.is_fitted
    }
    if needing:
        kinds = ", ".join(sorted(set(needing.values())))
        raise ConfigError(
            f"trainer.callbacks: the {what} of {', '.join(needing)} ({kinds}) need teacher "
            "statistics, and no radio_lit.callbacks.TeacherStatsEstimation estimates them: add "
            f"it (--trainer.callbacks+ radio_lit.callbacks.TeacherStatsEstimation), or {instead}"
        )
