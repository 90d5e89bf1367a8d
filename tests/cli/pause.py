"""A test-only callback: a run that stops making progress at a known step, to be SIGKILLed."""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl


class PauseAt(pl.Callback):
    """Before training step ``step``: touch ``flag`` and sleep until killed.

    The checkpoint of the previous step is complete by then, as it is when a real job is
    preempted between two steps; the DataLoader workers keep prefetching meanwhile.
    """

    def __init__(self, step: int, flag: str) -> None:
        super().__init__()
        self.step = step
        self.flag = flag

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            Path(self.flag).touch()
            while True:
                time.sleep(1)
