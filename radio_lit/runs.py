"""Which run folder a ``radio-lit fit`` writes into, and which checkpoint it resumes.

A run folder is the logger's ``<save_dir>/<name>/<version>`` (TensorBoard events,
``config.yaml``, ``checkpoints/``). Lightning gives every start a new ``version_N``; a run
that goes on after an interruption keeps its folder instead:

- ``--ckpt_path <run>/checkpoints/<file>.ckpt`` of a run of the same logger (same
  ``save_dir`` and ``name``) continues that run's folder, unless the config names a
  ``version``; TensorBoard hides the steps the interrupted run logged after that checkpoint
  (``SummaryWriter(purge_step=<the checkpoint's step>)``), so no step is shown twice.
- Under SLURM the folder is ``job<SLURM_JOB_ID>`` (``[choice]``: the same on every rank and
  on every start of the job, and it names the job whose ``slurm-<id>.out`` holds the output);
  a requeued job (``SLURM_RESTART_COUNT`` >= 1) given no ``--ckpt_path`` resumes the newest
  checkpoint of that folder, so the job goes on without the user's help.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from radio_lit.callbacks.preemption import checkpoint_dir
from radio_lit.cluster import slurm_job_id
from radio_lit.errors import ConfigError

#: Loggers whose folder radio-lit chooses (they take a ``version``).
_FOLDER_LOGGERS = (TensorBoardLogger, CSVLogger)


def _folder_logger(trainer: pl.Trainer) -> TensorBoardLogger | CSVLogger | None:
    """The first logger, when it is one whose version is still Lightning's to choose."""
    logger = trainer.loggers[0] if trainer.loggers else None
    if isinstance(logger, _FOLDER_LOGGERS) and logger._version is None:
        return logger
    return None


def _checkpoint_step(path: Path) -> int:
    """The ``global_step`` a checkpoint file was written at (read lazily: no tensor is loaded)."""
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return int(state.get("global_step", 0))


def continue_run(trainer: pl.Trainer, ckpt_path: str | os.PathLike[str]) -> bool:
    """Point the logger at the run folder that holds ``ckpt_path``, when that folder is one of
    this logger's runs (``<save_dir>/<name>/<version>/checkpoints/``); whether it did."""
    logger = _folder_logger(trainer)
    path = Path(ckpt_path).resolve()
    if logger is None or path.parent.name != "checkpoints":
        return False
    run_dir = path.parent.parent
    save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
    if run_dir.parent != Path(save_dir, str(logger.name or "")).resolve():
        return False
    logger._version = run_dir.name
    if isinstance(logger, TensorBoardLogger):
        logger._kwargs.setdefault("purge_step", _checkpoint_step(path))
    return True


def newest_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The most recently written ``*.ckpt`` of the run's checkpoint folder, if any."""
    found = sorted(checkpoint_dir(trainer).glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def prepare_fit(trainer: pl.Trainer, ckpt_path: str | None) -> str | None:
    """Choose the run folder of a ``fit`` and return the checkpoint it resumes (None: a new
    run). Called before any rank writes to the folder."""
    if ckpt_path is not None and Path(ckpt_path).is_file():
        continue_run(trainer, ckpt_path)
        return ckpt_path
    job = slurm_job_id()
    logger = _folder_logger(trainer)
    if job is None:
        return ckpt_path
    if logger is not None:
        logger._version = f"job{job}"
    if ckpt_path is None and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
        newest = newest_checkpoint(trainer)
        if newest is not None:
            if isinstance(logger, TensorBoardLogger):
                logger._kwargs.setdefault("purge_step", _checkpoint_step(newest))
            return str(newest)
    return ckpt_path


#: ``[choice]`` a checkpoint holds the trainable weights and, per weight, about two optimizer
#: moments (AdamW, LAMB): three times the weights' bytes, written twice at most at once
#: (``last.ckpt`` is replaced by writing a new file first).
_CHECKPOINT_COPIES = 6


def check_checkpoint_dir(trainer: pl.Trainer, module: pl.LightningModule) -> None:
    """Refuse, before training, a checkpoint folder that cannot be written or has too little
    free space for a checkpoint, rather than failing at the first save thousands of steps in.
    Every rank checks the folder it would write to (on shared storage, the same one)."""
    folder = checkpoint_dir(trainer)
    key = "the checkpoint folder (ModelCheckpoint dirpath, or the logger's save_dir)"
    probe = folder / f".radio-lit-write-test-{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"{key}: {folder} cannot be written ({error.strerror or error}); give a writable "
            "--trainer.default_root_dir or logger save_dir"
        ) from error
    weights = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    needed, free = weights * _CHECKPOINT_COPIES, shutil.disk_usage(folder).free
    if free < needed:
        raise ConfigError(
            f"{key}: {folder} has {free / 2**30:.2f} GiB free but a checkpoint of this model "
            f"with its optimizer state needs about {needed / 2**30:.2f} GiB; free space or "
            "give another --trainer.default_root_dir or logger save_dir"
        )
