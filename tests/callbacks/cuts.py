"""A student part cut from the graph from a given step on, for the guard's tests (in-process
and through ``radio-lit fit --trainer.callbacks+=tests.callbacks.cuts.CutStudent``)."""

from __future__ import annotations

import lightning.pytorch as pl


class CutStudent(pl.Callback):
    """From optimizer step ``step`` on, the student's first block's output is detached: the
    parameters before it (patch embedding, position embedding, the first block) get no
    gradient, as after a ``detach`` that only some steps' code path runs.

    Args:
        step: the first step of the cut.
    """

    def __init__(self, step: int = 50) -> None:
        super().__init__()
        self.step = step
        self.trainer: pl.Trainer | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.trainer = trainer
        pl_module.student.blocks[0].register_forward_hook(self._cut)

    def _cut(self, module, inputs, output):
        trainer = self.trainer
        training = trainer is not None and trainer.training and module.training
        return output.detach() if training and trainer.global_step >= self.step else output
