"""FixedPatternProbe: the share of the teachers' fixed-pattern noise the student reproduces,
at every validation (C-RADIOv4 report 2.3; the ablation rows of ``radio-lit ablate
--row-set c-radio``).

For every teacher wrapped in :class:`~radio_lit.teachers.FixedPatternTeacher`, each validation
batch is seen once more on *unshifted* views: the student's estimate of the teacher in the
teacher's space (student, adaptor head, normalizer inverse: :func:`module_view`, at the
module's ``student_resolution``) is brought to the teacher's grid
(:func:`radio_lit.geometry.grid.resample`:
the identity when the grids match) and compared with the teacher's *clean* features
(:meth:`FixedPatternTeacher.clean`) by :class:`~radio_lit.metrics.PatternShare`. At the end of
the validation epoch the values are logged as ``val/<teacher>/pattern_share`` and
``val/<teacher>/clean_mse``, so they reach every logger, ``trainer.callback_metrics``,
:class:`~radio_lit.ablation.FinalValidation` and the ablation tables. The raw student is
measured (not its EMA copy).

A teacher upsampled by FeatSharp (:class:`~radio_lit.upsamplers.UpsampledTeacher` around a
:class:`FixedPatternTeacher`) is measured on the wrapped teacher's own view and grid, whatever
the grid of its targets [choice]: the only grid on which the clean features and the pattern are
known, and the one on which a run that shrinks the student's map onto that teacher's grid is
measured too (the ``High-res`` rows of ``--row-set c-radio``).

Unlike the :class:`~radio_lit.evaluation.Evaluation` measures (``eval/…``, on their own image
sets after training steps), this one rides on the validation loop, so that it lands beside the
``val/…`` metrics of the same images. It costs nothing unless configured (a callback), and one
more student and teacher forward per validation batch when it is.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from radio_lit.callbacks._common import distillation_module
from radio_lit.core.errors import ConfigError
from radio_lit.data.views import as_float_images
from radio_lit.evaluation.view import module_view
from radio_lit.geometry.grid import resample
from radio_lit.metrics.fixed_pattern import PatternShare
from radio_lit.normalizers.statistics import statistics_ready
from radio_lit.teachers.fixed_pattern import FixedPatternTeacher
from radio_lit.training.batch import student_pixels
from radio_lit.upsamplers import UpsampledTeacher

__all__ = ["FixedPatternProbe", "patterned"]


def patterned(teacher: object) -> FixedPatternTeacher | None:
    """The :class:`FixedPatternTeacher` that ``teacher`` is, or that it upsamples (an
    :class:`~radio_lit.upsamplers.UpsampledTeacher` around one); else ``None``."""
    if isinstance(teacher, UpsampledTeacher):
        teacher = teacher.teacher
    return teacher if isinstance(teacher, FixedPatternTeacher) else None


class FixedPatternProbe(Callback):
    """Log ``val/<teacher>/pattern_share`` and ``val/<teacher>/clean_mse`` at each validation.

    Args:
        teachers: the teachers to measure (each a :class:`FixedPatternTeacher`, or an
            upsampled one); default every such teacher of the run.
    """

    def __init__(self, teachers: list[str] | None = None) -> None:
        self.teachers = teachers
        self._teachers: dict[str, FixedPatternTeacher] = {}
        self._metrics: dict[str, PatternShare] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        module = distillation_module(pl_module)
        found = {n: patterned(t) for n, t in module.teachers.items()}
        wrapped = [n for n, t in found.items() if t is not None]
        names = wrapped if self.teachers is None else self.teachers
        if not wrapped:
            raise ConfigError(
                "FixedPatternProbe: no teacher of this run carries a fixed pattern; wrap one in "
                "radio_lit.teachers.FixedPatternTeacher (model.teachers.<name>.class_path) or "
                "remove the probe from trainer.callbacks"
            )
        refused = [n for n in names if n not in wrapped]
        if refused:
            raise ConfigError(
                f"FixedPatternProbe: init_args.teachers names {refused}, which carry no fixed "
                f"pattern; the teachers with one are {wrapped}"
            )
        self._teachers = {n: t for n, t in found.items() if n in names and t is not None}

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        module = distillation_module(pl_module)
        if not all(map(statistics_ready, module.teacher_statistics().values())):
            return  # a sanity check before the first step: no teacher-space estimates yet
        crops = as_float_images(student_pixels(batch))
        estimates = module_view(module)(crops)
        height, width = module.student_resolution
        grid = (height // module.student.patch_size, width // module.student.patch_size)
        for name, teacher in self._teachers.items():
            clean = teacher.clean(crops, teacher.view_size(grid)).features
            size = tuple(clean.shape[1:3])
            if name not in self._metrics:
                self._metrics[name] = PatternShare(teacher.pattern(size)).to(clean.device)
            self._metrics[name].update(resample(estimates[name].features, size), clean)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logs = {}
        for name, metric in self._metrics.items():
            if metric.update_count == 0:
                continue
            for key, value in metric.compute().items():
                logs[f"val/{name}/{key}"] = value.float()
            metric.reset()
        if logs:
            pl_module.log_dict(logs)
