"""Preemption: stop every rank at one step boundary on a stop signal, save, requeue under SLURM.

SLURM warns a job before its time limit or a preemption with a signal (``--signal=USR1@120``)
and ends it with SIGTERM; Kubernetes sends SIGTERM; a user presses Ctrl-C (SIGINT). Saving a
checkpoint *inside* a signal handler (Lightning's SLURM auto-requeue) can hang a multi-process
run: the handler runs wherever the signal lands, and the save's collectives (the random states
of every rank, a sharded state dict) meet another rank that sits in DDP's gradient all-reduce,
where no Python handler can run (Lightning issue #21406). So here the handler only records the
signal; after every ``check_every_n_steps``-th training batch, all ranks agree with one small
all-reduce (the largest signal number any rank received), so that a signal that reached one rank
only, or the ranks at different steps, stops them all after the same step. Every rank then takes
part in :meth:`~lightning.pytorch.Trainer.save_checkpoint` (``last-preempted.ckpt`` in the run's
checkpoint folder, written where :class:`~lightning.pytorch.callbacks.ModelCheckpoint` writes,
so it resumes exactly as that callback's checkpoints do), the step's logs are written, and the
run stops before the next batch with :class:`~radio_lit.core.errors.Preempted`. Under SLURM, rank 0
first requeues the job (``scontrol requeue``); the requeued job resumes from the newest
checkpoint of the same run folder (:mod:`radio_lit.cli.runs`). A second Ctrl-C interrupts at once.
Once a resumed run has written a checkpoint of a later step (a whole training state: Lightning
calls ``on_save_checkpoint`` for no weights-only one), the ``last-preempted.ckpt`` it resumed
from is removed (rank 0), so that the folder's newest checkpoint is the run's last.

The handler is the process's :data:`radio_lit.distributed.cluster.STOP`: ``radio-lit fit`` takes the
signals before it builds anything (a signal then stops the build at once, nothing to save),
and this callback switches it to recording when training is set up (:meth:`Preemption.setup`).
``radio-lit fit`` adds this callback itself and turns Lightning's SLURM signal handling off
(``SLURMEnvironment(auto_requeue=False)``).
"""

from __future__ import annotations

import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.distributed import ReduceOp

from radio_lit.core.errors import Preempted
from radio_lit.distributed.cluster import STOP, requeue, slurm_job_id

#: File name of the checkpoint written on a stop signal (Lightning's ``ckpt_path="last"``
#: finds it too).
CHECKPOINT_NAME = "last-preempted.ckpt"


def checkpoint_dir(trainer: pl.Trainer) -> Path:
    """The folder where the run's :class:`ModelCheckpoint` writes: its ``dirpath``, or, as
    Lightning resolves it, ``<save_dir>/<name>/<version>/checkpoints`` of the first logger,
    or ``<default_root_dir>/checkpoints`` without one. Valid before ``fit`` starts."""
    callback = trainer.checkpoint_callback
    dirpath = getattr(callback, "dirpath", None)
    if dirpath:
        return Path(dirpath)
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        version = logger.version
        version = version if isinstance(version, str) else f"version_{version}"
        return Path(save_dir, str(logger.name), version, "checkpoints")
    return Path(trainer.default_root_dir, "checkpoints")


def checkpoint_step(path: Path) -> int:
    """The ``global_step`` a checkpoint file was written at (read lazily: no tensor is loaded)."""
    if path.is_dir():  # a sharded checkpoint: the step is in Lightning's meta.pt
        path = path / "meta.pt"
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return int(state.get("global_step", 0))


class Preemption(Callback):
    """Stop all ranks at one step boundary on SIGUSR1, SIGTERM or SIGINT; save; requeue.

    Args:
        check_every_n_steps: the ranks agree on whether to stop after every this many training
            batches (one all-reduce of one integer, and a host sync, each time). ``[choice]``
            1: the step's cost is negligible against a training step, and a signal is acted on
            after the step that was running.
    """

    def __init__(self, check_every_n_steps: int = 1) -> None:
        super().__init__()
        if check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be at least 1, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps
        self.stopping = 0  # the signal all ranks agreed to stop on (0: none)
        self.checkpoint: Path | None = None
        #: the command line that started the run (``radio-lit fit`` sets it), for the message
        self.command: list[str] | None = None
        self._batches = 0
        self._installed = False  # whether this callback installed the handler (not radio-lit fit)
        self._stale: tuple[Path, int] | None = None  # a preemption checkpoint and its step
        self._saved_step = -1  # the step of the last checkpoint written since

    # -- signal handling: record only ------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Record signals from here on (one that arrives while the run is set up is acted on
        after the first step)."""
        if stage == "fit":
            self._installed = STOP.install(raising=False)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take the signals back from the handlers Lightning registered when training started
        (its SIGTERM handler broadcasts from inside the handler); note a preemption checkpoint
        of an earlier step in the run's folder (the one a resumed run started from)."""
        STOP.take_back()
        path = checkpoint_dir(trainer) / CHECKPOINT_NAME
        if trainer.is_global_zero and path.exists():
            self._stale = (path, checkpoint_step(path))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._installed:
            STOP.uninstall()
            self._installed = False

    # -- a resumed run's preemption checkpoint ----------------------------------------------

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._saved_step = trainer.global_step

    def _drop_stale(self) -> None:
        """Remove the preemption checkpoint the run resumed from once a checkpoint of a later
        step is written (its save has returned: called before the next batch, and at the end)."""
        if self._stale is None or self._saved_step <= self._stale[1]:
            return
        path = self._stale[0]
        self._stale = None
        if path.is_dir():  # a sharded checkpoint
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._drop_stale()

    # -- at step boundaries ----------------------------------------------------------------

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Every rank: agree on the signal; if one came, every rank takes part in the save."""
        self._batches += 1
        if self.stopping or self._batches % self.check_every_n_steps:
            return
        self.stopping = agreed_signal(trainer, STOP.received)
        if not self.stopping:
            return
        self.checkpoint = checkpoint_dir(trainer) / CHECKPOINT_NAME
        self._stale = None  # written again now
        # a collective save: every rank calls it; the whole training state, as ModelCheckpoint
        trainer.save_checkpoint(self.checkpoint, weights_only=False)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Stop before the batch after the saved step (its logs and validation are written):
        under SLURM rank 0 requeues the job; rank 0 says where the run is and how it goes on;
        then every rank raises :class:`~radio_lit.core.errors.Preempted` together (a rank that
        exited early would make ``srun --kill-on-bad-exit`` end rank 0 mid-requeue)."""
        self._drop_stale()
        if not self.stopping or self.checkpoint is None:
            return
        run_dir = trainer.log_dir  # a broadcast under DDP: every rank takes part
        if trainer.is_global_zero:
            job = slurm_job_id()
            lines = [
                f"radio-lit: {signal.Signals(self.stopping).name} received: every rank stopped "
                f"after {trainer.global_step} steps",
                f"run folder: {run_dir or self.checkpoint.parent}",
                f"checkpoint: {self.checkpoint}",
            ]
            if job is not None:  # said first: requeueing ends every process of the job
                print("\n".join(lines), file=sys.stderr, flush=True)
                lines = [f"SLURM job {job} requeued: it resumes from this checkpoint"]
                refused = requeue(job)
                if refused is not None:
                    lines = [f"SLURM did not requeue job {job}: {refused}"]
                    lines.append(f"resume with: {self._resume_command()}")
            else:
                lines.append(f"resume with: {self._resume_command()}")
            print("\n".join(lines), file=sys.stderr, flush=True)
        trainer.strategy.barrier("preemption")
        raise Preempted(self.stopping)

    def _resume_command(self) -> str:
        """:attr:`command` with ``--ckpt_path`` set to the checkpoint just written."""
        if self.command is None:
            return f"the same command with --ckpt_path {self.checkpoint}"
        args = self.command
        kept = [
            a
            for i, a in enumerate(args)
            if not (a.startswith("--ckpt_path") or (i > 0 and args[i - 1] == "--ckpt_path"))
        ]
        return shlex.join([*kept, "--ckpt_path", str(self.checkpoint)])


def agreed_signal(trainer: pl.Trainer, received: int) -> int:
    """The largest signal number any rank received (0: none).

    One process needs no collective and reads no device tensor. Across ranks the flag is made
    on the device by a fill (``torch.full``: no host-to-device copy, which would wait for the
    device) and all-reduced; its one read is the check's only host-device synchronisation.
    """
    if trainer.world_size == 1:
        return received
    flag = torch.full((), received, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(flag, reduce_op=ReduceOp.MAX).item())
