"""What every evaluation measure shares: its report, its schedule, and how it is logged.

A measure is a :class:`Evaluation` callback. It runs

* every ``every_n_steps`` optimizer steps and once more at the end of ``fit`` (after the
  step's ``on_train_batch_end``, never inside the training step);
* at the end of ``radio-lit validate`` and ``radio-lit test`` (alone, on a checkpoint);
* from ``radio-lit evaluate`` (:mod:`radio_lit.cli.evaluate`), on a training checkpoint
  or an exported model, through :meth:`Evaluation.evaluate`.

Every rank runs the measure on its share of the images (the student's forward is collective
under FSDP); results are reduced across ranks and rank 0 writes them: scalars to every logger,
images, curves and text to TensorBoard, all under ``eval/``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from radio_lit.callbacks._common import distillation_module
from radio_lit.evaluation.view import ModelView, evaluation_mode, module_view
from radio_lit.normalizers.statistics import statistics_ready


@dataclass
class Report:
    """What one run of a measure produced.

    Attributes:
        scalars: tag -> value (``eval/...``), one point at the training step.
        images: tag -> ``[3, H, W]`` float image in ``[0, 1]``.
        curves: tag -> ``{x: y}`` (e.g. error against student resolution), drawn with x as
            the step axis under ``<tag>/step_<training step>``, and as a matplotlib figure when
            matplotlib is installed.
        text: tag -> markdown.
    """

    scalars: dict[str, float] = field(default_factory=dict)
    images: dict[str, Tensor] = field(default_factory=dict)
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)

    def update(self, other: Report) -> None:
        """Add ``other``'s entries to this report."""
        self.scalars.update(other.scalars)
        self.images.update(other.images)
        self.curves.update(other.curves)
        self.text.update(other.text)


class Evaluation(Callback):
    """Base of the evaluation callbacks: schedule, model view, logging.

    Subclasses implement :meth:`evaluate`.

    Args:
        every_n_steps: run every this many optimizer steps during ``fit`` (0: only at the end
            of ``fit``).
    """

    #: Whether the outputs it reads need a summary vector (a teacher without one, SAM, cannot).
    reads_summaries: ClassVar[bool] = False

    def __init__(self, every_n_steps: int = 1000) -> None:
        if every_n_steps < 0:
            raise ValueError(
                f"{type(self).__name__}: every_n_steps must be >= 0 (0 runs only at the end of "
                f"fit), got {every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self._last_step: int | None = None
        self.last_report: Report | None = None  #: what the last run measured (``fit`` prints it)

    def evaluate(self, view: ModelView) -> Report:
        """Run the measure on ``view`` (every rank calls it; the report is the same on all)."""
        raise NotImplementedError

    def outputs_read(self) -> list[str]:
        """The model outputs (``"backbone"``, teacher names) the measure reads: its
        ``outputs`` argument where it has one. Checked against the model's when the run is
        built (:mod:`radio_lit.cli.contracts`)."""
        return list(getattr(self, "outputs", None) or [])

    def required_teachers(self) -> list[str]:
        """Teachers the measure cannot run without (beyond the student's estimates)."""
        return []

    # -- schedule -----------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._last_step:
            self.run(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != self._last_step:
            self.run(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:
            self.run(trainer, pl_module)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run(trainer, pl_module)

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Report:
        """Evaluate the trainer's DistillationModule in eval mode and log the report."""
        module = distillation_module(pl_module)
        if not statistics_ready(module.normalizers):
            rank_zero_warn(
                f"{type(self).__name__} skipped at step {trainer.global_step}: the teacher "
                "normalizers are not fitted yet (no teacher-space estimates to evaluate)"
            )
            return Report()
        cached = [n for n in self.required_teachers() if n in module.teachers]
        cached = [n for n in cached if not module.teachers[n].live]
        if cached:
            rank_zero_warn(
                f"{type(self).__name__} skipped at step {trainer.global_step}: it runs teacher "
                f"{cached[0]}, which this run reads from a teacher-feature cache and does not "
                "build; radio-lit evaluate CHECKPOINT runs it with the teachers"
            )
            return Report()
        # The measures' data loaders draw from the global RNG: fork it, so that training
        # randomness (crops, CPE windows) is the same with and without evaluation.
        devices = [module.device] if module.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), evaluation_mode(module), torch.no_grad():
            report = self.evaluate(module_view(module))
        self._last_step = trainer.global_step
        self.last_report = report
        if trainer.is_global_zero:
            write_report(trainer.loggers, report, trainer.global_step)
        return report


def write_report(loggers: Sequence[Logger], report: Report, step: int) -> None:
    """Scalars to every logger at ``step``; images, curves and text to TensorBoard loggers."""
    for logger in loggers:
        if report.scalars:
            logger.log_metrics(report.scalars, step=step)
        if not isinstance(logger, TensorBoardLogger):
            continue
        writer = logger.experiment
        for tag, image in report.images.items():
            writer.add_image(tag, image.float().clamp(0, 1).cpu(), step)
        for tag, curve in report.curves.items():
            for x, y in sorted(curve.items()):
                writer.add_scalar(f"{tag}/step_{step}", y, x)
            figure = curve_figure(tag, curve)
            if figure is not None:
                writer.add_figure(tag, figure, step)
        for tag, text in report.text.items():
            writer.add_text(tag, text, step)
        writer.flush()


def curve_figure(tag: str, curve: dict[int, float]) -> Any:
    """A matplotlib line plot of ``curve`` if matplotlib is installed, else ``None``."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(4, 3))
    xs = sorted(curve)
    axes.plot(xs, [curve[x] for x in xs], marker="o")
    axes.set_xlabel("student resolution (px)")
    axes.set_title(tag, fontsize=8)
    figure.tight_layout()
    return figure


def images_of(batch: Any) -> Tensor:
    """The image tensor of a batch that is ``images`` or ``[images, labels]``."""
    return batch[0] if isinstance(batch, (list, tuple)) else batch
