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
- Otherwise a run that differs from its config is named for the difference, as the ablation
  runner names its rows: ``version_<N>-<what differs>``, from the command line's further
  ``--config`` files (their stems) and ``--key value`` overrides (``normalizer=Standardize``,
  ``data=CachedViews``), and ``version_<N>-test`` for ``radio-lit test`` / ``validate``
  (:func:`name_run`). Options that say where or on what hardware a run goes, not what it
  computes, are left out (:data:`NOT_NAMING`, ``[choice]``); ``config.yaml`` in the folder
  holds the whole resolved config.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
import yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from radio_lit.callbacks.preemption import checkpoint_dir, checkpoint_step
from radio_lit.core.errors import ConfigError
from radio_lit.distributed.cluster import slurm_job_id

#: Loggers whose folder radio-lit chooses (they take a ``version``).
_FOLDER_LOGGERS = (TensorBoardLogger, CSVLogger)


def _folder_logger(trainer: pl.Trainer) -> TensorBoardLogger | CSVLogger | None:
    """The first logger, when it is one whose version is still Lightning's to choose."""
    logger = trainer.loggers[0] if trainer.loggers else None
    if isinstance(logger, _FOLDER_LOGGERS) and logger._version is None:
        return logger
    return None


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
        logger._kwargs.setdefault("purge_step", checkpoint_step(path))
    return True


def newest_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The most recently written ``*.ckpt`` (file, or sharded checkpoint folder) of the run's
    checkpoint folder, if any."""
    found = sorted(checkpoint_dir(trainer).glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def prepare_fit(trainer: pl.Trainer, ckpt_path: str | None) -> str | None:
    """Choose the run folder of a ``fit`` and return the checkpoint it resumes (None: a new
    run). Called before any rank writes to the folder."""
    if ckpt_path is not None and Path(ckpt_path).exists():
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
                logger._kwargs.setdefault("purge_step", checkpoint_step(newest))
            return str(newest)
    return ckpt_path


class RunFolderState:
    """What a run folder held before a command wrote into it, to put back when the command
    stops on a user error or on a stop signal before it wrote a checkpoint (:meth:`restore`):
    a failed ``radio-lit fit --ckpt_path`` into a run leaves that run as it was, and a new run
    leaves no folder. Valid on the rank that creates the folder (rank 0)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.existed = folder is not None and folder.is_dir()
        self.files: dict[Path, bytes | None] = {}
        self.folders: set[Path] = set()
        self.checkpoints = _checkpoints(folder)
        if folder is not None and self.existed:
            self.folders = {path for path in folder.rglob("*") if path.is_dir()}
            for path in _written_files(folder):
                small = path.parent == folder and path.suffix in (".yaml", ".yml", ".json")
                self.files[path] = path.read_bytes() if small else None

    def restore(self) -> None:
        """Unless the command wrote a checkpoint (then it trained: everything is kept), remove
        a folder it created; in a folder that existed, remove the files it added (its
        TensorBoard event file, whose ``purge_step`` would hide the run's later steps) and put
        back the run's ``config.yaml`` (and ``hparams.yaml``) as they were."""
        folder = self.folder
        if folder is None or not folder.is_dir() or _checkpoints(folder) != self.checkpoints:
            return
        if not self.existed:
            shutil.rmtree(folder, ignore_errors=True)
            return
        for path in _written_files(folder):
            if path not in self.files:
                path.unlink(missing_ok=True)
        for path, content in self.files.items():
            if content is not None and (not path.is_file() or path.read_bytes() != content):
                path.write_bytes(content)
        added = {path for path in folder.rglob("*") if path.is_dir()} - self.folders
        for path in sorted(added, reverse=True):  # the deepest first
            if not any(path.iterdir()):
                path.rmdir()


def _checkpoints(folder: Path | None) -> dict[Path, float]:
    """The checkpoints (``.ckpt`` files and sharded folders) under ``folder`` and when each
    was last written."""
    if folder is None or not folder.is_dir():
        return {}
    return {path: path.stat().st_mtime for path in folder.rglob("*.ckpt")}


def _written_files(folder: Path) -> list[Path]:
    """The files under ``folder`` other than checkpoints (a ``.ckpt`` file or sharded folder)."""
    return [
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part.endswith(".ckpt") for part in path.relative_to(folder).parts)
    ]


#: ``[choice]`` a checkpoint holds the trainable weights and, per weight, about two optimizer
#: moments (AdamW, LAMB): three times the weights' bytes, written twice at most at once
#: (``last.ckpt`` is replaced by writing a new file first).
_CHECKPOINT_COPIES = 6


def check_checkpoint_dir(trainer: pl.Trainer, module: pl.LightningModule) -> None:
    """Refuse, before training, a checkpoint folder that cannot be written or has too little
    free space for a checkpoint, rather than failing at the first save thousands of steps in.
    Every rank checks the folder it would write to (on shared storage, the same one); only
    rank 0 creates it. This runs before the ranks have a process group, so another rank's run
    folder is its own guess (:func:`name_run` counts the folders it sees), which Lightning
    replaces by rank 0's once they have one (``Trainer.log_dir`` and ``ModelCheckpoint``
    broadcast it): the other ranks check the nearest folder above it that exists."""
    folder = checkpoint_dir(trainer)
    if not trainer.is_global_zero:
        folder = next(p for p in (folder, *folder.parents) if p.is_dir())
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


#: Command-line options that do not name a run (``[choice]``): where it writes or resumes,
#: which hardware runs it, and what only changes how it is shown.
NOT_NAMING = (
    "ckpt_path",
    "print_config",
    "model.init_from",
    "trainer.logger",
    "trainer.default_root_dir",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.plugins",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "data.init_args.num_workers",
)


def _short(value: str) -> str:
    """A value as a folder-name part: a class path's class, a file's stem."""
    value = value.strip()
    if value.startswith("{"):  # a JSON / YAML class_path mapping
        loaded = yaml.safe_load(value)
        value = str(loaded.get("class_path", value)) if isinstance(loaded, dict) else value
    if "/" in value or value.endswith((".yaml", ".yml", ".ckpt")):
        value = Path(value.rstrip("/")).stem or value
    elif re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value):  # a class path
        value = value.rsplit(".", 1)[-1]
    return re.sub(r"[^\w.=+-]+", "_", value)[:40]


def what_differs(command_line: Sequence[str]) -> list[str]:
    """The parts of a ``radio-lit <subcommand> …`` command line that change the run its first
    ``--config`` describes: further config files' stems and ``key=value`` overrides."""
    args = [str(a) for a in command_line]
    parts, configs, i = [], 0, 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            i += 1
            continue
        key, has_value, value = arg[2:].partition("=")
        if not has_value and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        i += 1
        if key == "config":
            configs += 1
            if configs > 1:
                parts.append(_short(value))
            continue
        if key.startswith(NOT_NAMING):
            continue
        short = key.split(".", 1)[-1] if "." in key else key
        short = short.replace("init_args.", "").removesuffix(".class_path")
        parts.append(f"{short}={_short(value)}" if value else short)
    return parts


def name_run(trainer: pl.Trainer, subcommand: str, command_line: Sequence[str]) -> None:
    """Name the run folder for what differs from the config (module docstring), unless the
    folder is already chosen (a config's ``version``, a continued run, a SLURM job). The
    number counts every ``version_<N>…`` folder of the logger (Lightning's skips named ones)."""
    logger = _folder_logger(trainer)
    if logger is None:
        return
    parts = ([] if subcommand == "fit" else [subcommand]) + what_differs(command_line)
    save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
    root = Path(save_dir, str(logger.name or ""))
    taken = [re.match(r"version_(\d+)", p.name) for p in root.glob("version_*")]
    number = max((int(m.group(1)) + 1 for m in taken if m), default=0)
    logger._version = "-".join([f"version_{number}", *parts])[:150]
