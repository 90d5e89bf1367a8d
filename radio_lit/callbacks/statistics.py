"""TeacherStatsEstimation: estimate teacher statistics at the start of a stage (PHI-S A.7).

PHI-S table 10: every stage spends its first 3,000 steps ("Dist Est. Steps") estimating the
teacher distributions, starting from scratch because a new resolution changes them. The
targets always use the current estimate, refitted periodically; afterwards the statistics
are frozen for the rest of the stage.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import nn

from radio_lit.core.errors import ConfigError


@runtime_checkable
class EstimatesStatistics(Protocol):
    """What the callback drives: a LightningModule with teacher statistics (normalizers,
    summary dispersions) that it accumulates while ``estimate_statistics`` is set and refits
    while ``refit_statistics`` is: :class:`~radio_lit.module.DistillationModule`.
    (:class:`~radio_lit.upsamplers.FeatSharpModule` fixes its normalizer before its first step,
    by a pre-pass of its own, as FeatSharp does.)"""

    estimate_statistics: bool
    refit_statistics: bool

    def teacher_statistics(self) -> dict[str, nn.ModuleDict]: ...


def _estimating(pl_module: pl.LightningModule) -> Any:
    """``pl_module``, or a :class:`~radio_lit.core.errors.ConfigError` saying what the callback
    needs of it."""
    if not isinstance(pl_module, EstimatesStatistics):
        raise ConfigError(
            "TeacherStatsEstimation needs a module with teacher statistics "
            "(teacher_statistics(), estimate_statistics, refit_statistics), such as "
            f"radio_lit.DistillationModule; got {type(pl_module).__name__} (a FeatSharpModule "
            "estimates its normalizer itself before its first step: remove the callback and "
            "set model.init_args.statistics_batches)"
        )
    return pl_module


class TeacherStatsEstimation(Callback):
    """Accumulate and refit every teacher normalizer during the first ``steps`` steps.

    Args:
        steps: optimizer steps of estimation at the start of the stage (PHI-S: 3,000).
        refit_every: refit the transforms every this many steps while estimating; the
            first step and the last estimation step always refit.
        log_spectrum: also write each normalizer's eigenvalue spectrum as a TensorBoard
            histogram at every refit.

    A fresh stage resets every normalizer at fit start. A resumed run does not: the
    statistics come back from the checkpoint (they are module buffers) and estimation
    continues from the restored global step, so it ends with the statistics of an
    uninterrupted run.
    """

    def __init__(self, steps: int = 3000, refit_every: int = 100, log_spectrum: bool = True):
        super().__init__()
        if steps < 1 or refit_every < 1:
            raise ValueError("steps and refit_every must be positive")
        self.steps = steps
        self.refit_every = refit_every
        self.log_spectrum = log_spectrum
        self._resumed = False

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "refit_every": self.refit_every}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.refit_every = int(state_dict["refit_every"])
        self._resumed = True

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = _estimating(pl_module)
        if not self._resumed:
            for statistics in module.teacher_statistics().values():
                for statistic in statistics.values():
                    statistic.reset()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        module = _estimating(pl_module)
        step = trainer.global_step
        module.estimate_statistics = step < self.steps
        module.refit_statistics = module.estimate_statistics and (
            step % self.refit_every == 0 or step == self.steps - 1
        )

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        module = _estimating(pl_module)
        if module.refit_statistics:
            self._log_diagnostics(trainer, module)
        module.estimate_statistics = False
        module.refit_statistics = False

    def _log_diagnostics(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Per teacher: the normalizer's scale(s) and effective rank; the eigenvalue spectrum;
        the summary dispersion (``AngleBalanced``)."""
        statistics = module.teacher_statistics().values()
        for name, normalizer in ((n, s) for group in statistics for n, s in group.items()):
            scalars = {f"stats/{name}/{k}": v for k, v in normalizer.diagnostics().items()}
            if scalars:
                module.log_dict(scalars, on_step=True, on_epoch=False)
            spectrum = normalizer.spectrum() if self.log_spectrum else None
            experiment = getattr(trainer.logger, "experiment", None)
            if spectrum is not None and hasattr(experiment, "add_histogram"):
                experiment.add_histogram(
                    f"stats/{name}/eigenvalues", spectrum.float().cpu(), trainer.global_step
                )
