"""A training step's host-device synchronisations: its scalar reads of device tensors
(benchmarks/dispatch.py, ``ScalarReads``, which follows on a CPU which tensors a GPU would hold).
A step reads one device value, the guard's verdict; a logging step adds one copy of every
logged value together; the preemption check of one process reads none.
"""

from __future__ import annotations

from collections import Counter

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from benchmarks.dispatch import ScalarReads
from radio_lit.callbacks import NonFiniteGuard
from radio_lit.callbacks.preemption import Preemption
from radio_lit.metrics.logging import logs_this_step
from tests.builders import cpu_trainer, image_batches, tiny_module


class DeviceReadsPerStep(pl.Callback):
    """The device reads of each step, from its start (its batch on the device) to the next
    step's start (its logging done)."""

    def __init__(self) -> None:
        self.steps: list[Counter[str]] = []
        self.logged: list[bool] = []
        self.reads: ScalarReads | None = None

    def _close(self) -> None:
        if self.reads is not None:
            self.reads.__exit__(None, None, None)
            self.steps.append(Counter(read.where for read in self.reads.device_syncs))
            self.reads = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._close()
        self.logged.append(logs_this_step(trainer))
        self.reads = ScalarReads().__enter__()
        self.reads.track(*pl_module.parameters(), *pl_module.buffers(), batch)

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()


def test_a_step_reads_the_guards_verdict_and_a_logging_step_one_copy_more(tmp_path):
    torch.manual_seed(0)
    probe = DeviceReadsPerStep()
    trainer = cpu_trainer(
        tmp_path,
        max_steps=4,
        log_every_n_steps=2,
        logger=CSVLogger(tmp_path),
        callbacks=[NonFiniteGuard(), Preemption(), probe],
    )
    trainer.fit(tiny_module(), image_batches(16, 4))
    assert probe.logged == [True, True, False, True]
    guard = [where for where in probe.steps[2] if "radio_lit/callbacks/guard.py" in where]
    assert len(guard) == 1 and sum(probe.steps[2].values()) == 1, probe.steps[2]
    for step in (1, 3):  # the loss, the per-teacher terms and the weights in one copy
        copies = [where for where in probe.steps[step] if "radio_lit/metrics/logging.py" in where]
        assert len(copies) == 1 and sum(probe.steps[step].values()) == 2, probe.steps[step]
