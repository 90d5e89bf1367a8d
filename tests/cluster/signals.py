"""Test-only callbacks: a run that signals itself, or slows down, at a known step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl


class SignalAt(pl.Callback):
    """Send ``signum`` to this process in the middle of the student's forward of training
    step ``step`` on rank ``rank`` (where a handler that saved would meet the other ranks in
    a collective), once; with ``group``, to its whole process group (its DataLoader workers
    too), as SLURM signals every process of a job step."""

    def __init__(self, rank: int, step: int, signum: int, group: bool = False) -> None:
        super().__init__()
        self.rank, self.step, self.signum, self.group = rank, step, signum, group
        self._hook = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank != self.rank or trainer.global_step != self.step:
            return
        blocks = pl_module.student.blocks

        def send(module, args):
            self._hook.remove()
            if self.group:
                os.killpg(os.getpgid(0), self.signum)
            else:
                os.kill(os.getpid(), self.signum)

        self._hook = blocks[len(blocks) // 2].register_forward_pre_hook(send)


class SlowFrom(pl.Callback):
    """From training step ``step`` on, until ``until`` exists (if given): touch ``flag`` and
    sleep ``seconds`` before each step (a window in which the test signals the job mid-run)."""

    def __init__(self, step: int, flag: str, seconds: float = 1.0, until: str | None = None):
        super().__init__()
        self.step, self.flag, self.seconds, self.until = step, flag, seconds, until

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step and not (self.until and Path(self.until).exists()):
            Path(self.flag).touch()
            time.sleep(self.seconds)
