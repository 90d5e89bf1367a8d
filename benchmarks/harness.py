"""How every benchmark builds a config's module and batch: one place, one way.

A benchmark reads a config as ``radio-lit fit`` does (radio-lit's own ``RadioLitCLI``, not run)
and measures its module on one device. What it changes to get there is here:

* :func:`load_config`, :func:`merged`: the raw YAML (an overlay merged into its base);
* :func:`parse`: the config's ``RadioLitCLI`` with command-line overrides, built, not run;
* :func:`build`: the same with random weights (pretrained tags, checkpoints and pretrained
  names dropped: :func:`random_weight_overrides`), teachers shortened to ``teacher_depth``
  blocks (widths kept), a trainer that writes nothing, its models created on the run's device
  (:func:`on_device`);
* :func:`one_device`, :func:`photographs`: overrides that put a config written for many GPUs on
  one device, and give it the shipped photographs as data;
* :func:`first_batch`, :func:`in_memory`, :func:`fit_statistics`: one batch of the config's
  data, a loader that yields batches already read, the teachers' statistics fitted once on a
  batch (no estimation while timed);
* :func:`trainer`, :func:`fit_times`: a Trainer of a benchmark's own that writes nothing,
  and the per-step times of a fit;
* :func:`step_arguments`, :func:`quiet`, :func:`return_freed_memory`, :func:`synchronizer`:
  the command line and process set-up the step benchmarks share.

Scripts import it as ``benchmarks.harness`` after putting the repository root first on
``sys.path`` (they run as ``python benchmarks/<script>.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from radio_lit.planning.configs import load_config, merged  # noqa: F401
from radio_lit.planning.random_weights import (  # noqa: F401 (the benchmarks' names for them)
    SAM_ENCODERS,
    override,
    random_init,
    random_weight_overrides,
    shorten_trunk,
)

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
#: Passes over the 10 shipped photographs per epoch: 640 random crops, more than a GPU batch.
PHOTO_REPEATS = 64
#: A trainer that logs, checkpoints and calls back nothing (for benchmarks that fit their own).
BARE_TRAINER = (
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.callbacks=[]",
)


# ------------------------------------------------------------------------------------------
# the process and the command line
# ------------------------------------------------------------------------------------------
def step_arguments(description: str, steps_help: str) -> argparse.ArgumentParser:
    """The arguments of the benchmarks that train a config for a few measured steps
    (``--config --steps --warmup --device --teacher-depth --threads``); other arguments
    (``--model.* --trainer.* --data...``) go to radio-lit's parser (``parse_known_args``)."""
    parser = argparse.ArgumentParser(
        description=description.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other arguments (--model.*, --trainer.*, --data...) go to radio-lit's parser.",
    )
    parser.add_argument("--config", default=str(QUICKSTART))
    parser.add_argument("--steps", type=int, default=3, help=steps_help)
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--teacher-depth",
        type=int,
        default=None,
        help="shorten every teacher to this many blocks, widths kept (CPU runs of real configs)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    return parser


def quiet() -> None:
    """Warnings and Lightning's information off (call it once radio-lit is imported: importing
    Lightning sets its loggers' levels)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def return_freed_memory() -> None:
    """Let glibc give freed tensors back to the OS at once (allocations of 64 KiB and more are
    mapped, the threshold fixed): a built-then-shortened teacher (SigLIP2-g: 4 GiB) does not
    stay resident while the steps run, nor ``train_step.py``'s first side while its second
    runs (CPU machines)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        ctypes.CDLL(name).mallopt(-3, 65536)  # M_MMAP_THRESHOLD


def synchronizer(device: Any) -> Callable[[], None]:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on CUDA, nothing on
    a CPU (its operations return when done)."""
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------
def parse(config: str | Path, *overrides: str) -> Any:
    """The ``RadioLitCLI`` of ``radio-lit fit --config config overrides...``: parsed and built
    (module, data module, trainer), not run."""
    from radio_lit.cli.app import RadioLitCLI

    return RadioLitCLI(run=False, args=["--config", str(config), *overrides])


# ------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------
def on_device(device: str, build_on_host: bool = False) -> contextlib.AbstractContextManager[Any]:
    """Where :func:`build` creates the models' tensors: on a GPU (``device == "cuda"``) the
    default device is the GPU, so that random initialisation of billions of teacher and
    student weights runs there (tens of seconds per recipe on the host's cores otherwise);
    ``build_on_host`` (or a CPU run) keeps the host. A library that moves its model back to
    the host itself (open_clip's ``create_model``) is moved to the GPU by the Trainer."""
    import torch

    if device != "cuda" or build_on_host:
        return contextlib.nullcontext()
    return torch.device("cuda")


def build(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    max_steps: int,
    device: str = "cpu",
    pretrained: bool = False,
    teacher_depth: int | None = None,
    build_on_host: bool = False,
) -> Any:
    """The ``RadioLitCLI`` of ``config`` for a benchmark: random weights unless ``pretrained``,
    teachers of ``teacher_depth`` blocks, ``max_steps`` training steps on ``device`` with no
    validation, summary or progress bar, its run folder a new temporary one, its models created
    on ``device`` (:func:`on_device`). ``overrides`` come last and win. The config's evaluation
    measures are built (their errors are the config's) and left out of the trainer: they run
    at the end of fit, after the steps a benchmark measures."""
    from radio_lit.evaluation.base import Evaluation

    raw = load_config(config)
    model = raw.get("model") or {}
    extra = []
    for name, entry in (model.get("teachers") or {}).items():
        extra += random_weight_overrides(name, entry, pretrained, teacher_depth)
    teacher = (model.get("init_args") or {}).get("teacher") if "class_path" in model else None
    if teacher is not None:  # a module of its own (configs/featsharp): its one teacher
        at = "--model.init_args.teacher"
        extra += random_weight_overrides("teacher", teacher, pretrained, teacher_depth, at)
    student = (model.get("student") or {}).get("init_args") or {}
    if not pretrained and student.get("pretrained"):
        extra.append("--model.student.init_args.pretrained=false")
    root = tempfile.mkdtemp(prefix="radio_lit_benchmark_")
    extra += [
        f"--trainer.max_steps={max_steps}",
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=0",
        f"--trainer.accelerator={device}",
    ]
    if (raw.get("trainer") or {}).get("logger"):
        extra.append(f"--trainer.logger.init_args.save_dir={root}")
    given = [*extra, *overrides]
    with on_device(device, build_on_host):
        cli = parse(config, *(_one_teacher_override(teacher, given) if teacher else given))
    callbacks = cli.trainer.callbacks
    callbacks[:] = [c for c in callbacks if not isinstance(c, Evaluation)]
    if teacher_depth is not None:
        for name, built in getattr(cli.model, "teachers", {}).items():
            shorten_trunk(name, built, teacher_depth)
    return cli


def _one_teacher_override(entry: dict[str, Any], overrides: list[str]) -> list[str]:
    """``overrides`` with those of ``--model.init_args.teacher.<...>`` folded into one override
    of the whole entry: jsonargparse reads ``null`` given to an option nested in a module's
    own ``init_args`` as the string ``"None"``, a whole entry as JSON it reads right."""
    import yaml

    prefix = "--model.init_args.teacher."
    teacher, rest = copy.deepcopy(entry), []
    for given in overrides:
        if not given.startswith(prefix):
            rest.append(given)
            continue
        path, value = given[len(prefix) :].split("=", 1)
        *parents, leaf = path.split(".")
        node = teacher
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return [*rest, override("--model.init_args.teacher", teacher)]


def one_device(
    config: Mapping[str, Any], *, strategy: str = "one rank", float32: bool = False
) -> tuple[list[str], list[str]]:
    """Overrides that run ``config`` on one device with no logger, and notes saying what they
    changed. ``strategy``: ``"one rank"`` keeps the config's strategy class on one rank
    (``ModelParallelStrategy`` with data and tensor parallel sizes 1; a strategy given by name
    becomes ``auto``), ``"auto"`` replaces it. ``float32``: precision ``32-true`` and float32
    teachers (a CPU: bf16 matrix products are ~50x slower than float32 without bf16
    instructions, and torch's CPU kernels lack a bf16 antialiased resize)."""
    trainer = config.get("trainer") or {}
    out = ["--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.logger=false"]
    notes: list[str] = []
    given = trainer.get("strategy")
    strategy_class = given.get("class_path", "") if isinstance(given, dict) else ""
    if strategy == "auto" or not strategy_class:
        if given not in (None, "auto"):
            out.append("--trainer.strategy=auto")
            notes.append("strategy auto (one process)")
    elif strategy_class.endswith("ModelParallelStrategy"):
        out += [
            "--trainer.strategy.init_args.data_parallel_size=1",
            "--trainer.strategy.init_args.tensor_parallel_size=1",
        ]
    if float32:
        if str(trainer.get("precision", "32-true")) not in ("32", "32-true"):
            out.append("--trainer.precision=32-true")
            notes.append(f"precision 32-true instead of {trainer['precision']}")
        teachers = (config.get("model") or {}).get("teachers") or {}
        for name, entry in teachers.items():
            if (entry.get("init_args") or {}).get("dtype") in ("bfloat16", "float16"):
                out.append(f"--model.teachers.{name}.init_args.dtype=float32")
                notes.append(f"teacher {name} in float32")
    return out, notes


def photographs(
    crop: int, batch: int | None = None, repeats: int = PHOTO_REPEATS, validation: bool = False
) -> list[str]:
    """Overrides that train on the shipped photographs (``radio_lit:sample_images``, 10 of
    them, each pass ``repeats`` times) at ``crop`` px, in the main process; ``validation``:
    validate on them too."""
    out = [
        "--data=radio_lit.data.ImageFolderDataModule",
        "--data.init_args.train_dir=radio_lit:sample_images",
        f"--data.init_args.crop_size={crop}",
        "--data.init_args.num_workers=0",
        f"--data.init_args.repeats={repeats}",
    ]
    if validation:
        out.append("--data.init_args.val_dir=radio_lit:sample_images")
    if batch is not None:
        out.append(f"--data.init_args.batch_size={batch}")
    return out


# ------------------------------------------------------------------------------------------
# a batch
# ------------------------------------------------------------------------------------------
def first_batch(datamodule: Any) -> Any:
    """One batch of ``datamodule``'s training data (uint8 crops on the CPU)."""
    datamodule.setup("fit")
    return next(iter(datamodule.train_dataloader()))


def in_memory(batches: Sequence[Any]) -> Any:
    """A DataLoader yielding ``batches``, already read (no collation, no reading)."""
    from torch.utils.data import DataLoader

    return DataLoader(batches, batch_size=None, shuffle=False, num_workers=0)


def fit_statistics(module: Any, batch: Any, device: Any = None) -> None:
    """Fit every teacher statistic (normalizers; summary dispersions) once on ``batch``'s
    teacher outputs on the loss grid (every partition on the whole batch at its evaluation
    resolution), and switch estimation off: no side of a benchmark estimates while timed.
    ``device``: where the module runs (default: where it is)."""
    import torch

    from radio_lit.data.views import as_float_images
    from radio_lit.normalizers.statistics import accumulate_statistics

    if device is not None:
        module.to(device)
        batch = batch.to(device)
    module.partitions.place(1, 0)
    with torch.no_grad():
        crop = as_float_images(batch)
        outputs = [module.chunk_teachers(crop, c) for c in module.partitions.chunks(crop, False)]
    features = [{n: o.features for n, o in chunk.items()} for chunk in outputs]
    summaries = [
        {n: o.summary for n, o in chunk.items() if o.summary is not None} for chunk in outputs
    ]
    accumulate_statistics(module.normalizers, features, True, {})
    accumulate_statistics(module.dispersions, summaries, True, {})
    module.estimate_statistics = module.refit_statistics = False


# ------------------------------------------------------------------------------------------
# trainers of a benchmark's own
# ------------------------------------------------------------------------------------------
def trainer(**options: Any) -> Any:
    """A ``lightning.pytorch.Trainer`` that writes and shows nothing (no logger, checkpoints,
    progress bar or model summary), on one device unless ``options`` say otherwise."""
    import lightning.pytorch as pl

    quiet = dict(
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return pl.Trainer(**{**quiet, **options})


def fit_times(template: Any, loader: Any, steps: int, warmup: int) -> list[float]:
    """Per-step seconds of one CPU fit of a copy of ``template`` on ``loader``: the time
    between consecutive ``on_train_batch_start`` calls (every cost of the loop), the first
    ``warmup`` steps dropped."""
    import lightning.pytorch as pl
    import torch

    times: list[float] = []

    class StepTimer(pl.Callback):
        mark: float | None = None

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            now = time.perf_counter()
            if self.mark is not None and index > warmup:
                times.append(now - self.mark)
            self.mark = now

        def on_train_end(self, trainer: Any, module: Any) -> None:
            times.append(time.perf_counter() - self.mark)

    fit = trainer(
        accelerator="cpu",
        max_steps=warmup + steps,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[StepTimer()],
    )
    torch.manual_seed(0)
    fit.fit(copy.deepcopy(template), train_dataloaders=loader)
    return times
