"""FreezeBody: keep the student trunk fixed while the heads adapt (PHI-S A.7, table 10).

PHI-S freezes the trunk for the first 5,000 steps of every stage ("Frozen Body Steps") so
the heads can adjust to the new (and still moving) normalized target distributions.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim import Optimizer

from radio_lit.callbacks._common import distillation_module


class FreezeBody(Callback):
    """Drop the student's gradients before every optimizer step of the first ``steps`` steps.

    ``requires_grad`` is never toggled: DDP leaves parameters that were frozen when it
    wrapped the model out of gradient reduction for good (Lightning #20340). Dropping the
    gradients (``grad = None``) makes every optimizer skip the trunk — no update, no weight
    decay, no moment — while the heads train. The schedule follows ``trainer.global_step``,
    which checkpoints restore, so a resumed run unfreezes at the same step.

    While the trunk is held, nothing runs for it (:attr:`~radio_lit.training.student_step.
    StudentStep.trunk_frozen`, set before each step): the EMA student holds its trunk's
    average, taking no step toward weights that do not train, while its heads' EMA follows
    the heads; and MESA's EMA forward is skipped when its gradient would reach the trunk only
    (``applies_to: backbone``), as that gradient is dropped ``[choice]``.

    At the first unfrozen step the optimizer's state of the trunk is forgotten
    (:func:`restart_optimizer_state`): the trunk's moment estimates and step counters start
    there, as a fresh optimizer's would. This needs the trunk in parameter groups of its own
    (``DistillationModule.parameter_groups``), or a group step counter (timm ``Lamb``) shared
    with the heads would count the frozen steps and skip the trunk's bias correction.

    Args:
        steps: optimizer steps with a frozen trunk at the start of the stage (PHI-S: 5,000).
    """

    def __init__(self, steps: int = 5000) -> None:
        super().__init__()
        if steps < 0:
            raise ValueError("steps must be non-negative")
        self.steps = steps

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict["steps"])

    def holds(self, step: int) -> bool:
        """Whether the trunk's gradients are dropped at optimizer step ``step``."""
        return step < self.steps

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        frozen = self.holds(trainer.global_step)  # this step's gradients of the trunk drop
        distillation_module(pl_module).student_step.trunk_frozen = frozen

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        distillation_module(pl_module).student_step.trunk_frozen = False

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        if trainer.global_step > self.steps:
            return
        trunk = list(distillation_module(pl_module).student.parameters())
        if not self.holds(trainer.global_step):
            restart_optimizer_state(optimizer, trunk)
            return
        for param in trunk:
            param.grad = None


def restart_optimizer_state(optimizer: Optimizer, params: list[Tensor]) -> None:
    """Forget ``optimizer``'s state of ``params``, so their next update is a first step.

    Per-parameter state (AdamW's moments and step) is dropped, and so is the step counter of
    every parameter group made only of ``params`` (timm ``Lamb`` counts steps per group, and
    counts them even for a group without gradients): after the frozen-trunk phase, the
    trunk's first update is then what a fresh optimizer's first update would be.
    """
    ids = {id(p) for p in params}
    for param in params:
        optimizer.state.pop(param, None)
    for group in optimizer.param_groups:
        if group["params"] and all(id(p) in ids for p in group["params"]):
            group.pop("step", None)
