"""``radio-lit plan``: what a run costs at N GPUs (memory per rank, step time, images/s,
GPU-hours, cache disk), counted on fake tensors.

    radio-lit plan --config configs/recipes/c-radio/stage1.yaml --gpus 64 --gpu h100
    radio-lit plan --config configs/stage1.yaml --gpus 1 --gpu h200 --json
    radio-lit plan --stages configs/recipes/c-radio/stage1.yaml configs/recipes/c-radio/stage2.yaml
    radio-lit plan --calibrate my-gpu.calibration.yaml      # measure this device (minutes)
    radio-lit plan --config configs/stage1.yaml --calibration my-gpu.calibration.yaml
    radio-lit plan --config configs/recipes/c-radio/stage1.yaml --gpus 64 --compare-layouts

The run is built as ``radio-lit fit`` builds it (radio-lit's CLI, every configured class), its
teachers and student on the meta device with random weights (nothing is loaded or downloaded:
:mod:`radio_lit.planning.meta_build`), its data the config's crop and batch on synthetic
images; each distinct rank's step is then run on fake tensors (:mod:`radio_lit.planning`).
Any other ``--section.key value`` option is applied to the config, as for ``radio-lit fit``
(``--teacher-depth K``: teachers of K blocks at their real widths, as the benchmarks run them).
``--compare-layouts`` plans each stage also in the balanced layout (every partition on every
rank, :mod:`radio_lit.planning.layout`) and in the balanced layout packed (a rank's partitions
in one student forward), from the same build and calibration, side by side.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from radio_lit.cache.manifest import DTYPES
from radio_lit.cli.app import RadioLitCLI
from radio_lit.core.errors import CommandParser, ConfigError
from radio_lit.planning.configs import merged
from radio_lit.planning.counting import count_step, fake_module, largest_draws
from radio_lit.planning.devices import device
from radio_lit.planning.layout import compared_layouts, comparison
from radio_lit.planning.meta_build import on_meta, planning_build
from radio_lit.planning.plan import (
    LoopStep,
    StagePlan,
    distinct_ranks,
    plan_stage,
    recipe_total,
    strategy_name,
    table,
)
from radio_lit.planning.random_weights import random_weight_overrides, shorten_trunk
from radio_lit.planning.repeated_blocks import BlockRecords
from radio_lit.planning.time_model import TimeModel, load_calibration
from radio_lit.planning.verdict import assumptions, packed_assumption

__all__ = ["main"]

#: ImageNet-1k's training images: the default count of the cache estimate [choice].
IMAGENET_TRAIN = 1_281_167


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="radio-lit plan",
        description="What a run costs before it runs: memory per rank, FLOPs by part, step "
        "time, images/s and GPU-hours at --gpus GPUs of --gpu, the teacher cache's disk. Any "
        "other --section.key value option is applied to the config, as for radio-lit fit.",
    )
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--config", action="append", help="the run's config(s), as for fit")
    given.add_argument("--stages", nargs="+", help="a recipe's stage configs, in order")
    parser.add_argument(
        "--gpus", type=int, nargs="+", default=None, help="GPU count(s); default: devices x nodes"
    )
    parser.add_argument("--gpu", default="h100", help="h100, h200, a100, b200 or a YAML file")
    parser.add_argument("--json", action="store_true", help="the same figures as JSON")
    parser.add_argument("--teacher-depth", type=int, default=None, help="teachers of K blocks")
    parser.add_argument(
        "--largest-draws",
        action="store_true",
        help="count each rank's step at its partitions' largest resolutions only (faster; the "
        "step time is then the largest draw's, not the average over the draws)",
    )
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="plan training step S: before FreezeBody's steps the trunk is held (no gradients "
        "or optimizer state of its own), before TeacherStatsEstimation's the teacher statistics "
        "are accumulated and all-reduced, step 0 has no earlier gradients or optimizer state; "
        "default: a step after every warm-up, the run's largest",
    )
    parser.add_argument(
        "--cache-images",
        type=int,
        default=None,
        help=f"images in the teacher cache (default: ImageNet-1k's {IMAGENET_TRAIN:,})",
    )
    parser.add_argument(
        "--calibrate",
        metavar="FILE",
        default=None,
        help="measure this device (matrix products, attention, bandwidth, the host's cost per "
        "operation: radio_lit/planning/calibrate.py) and write FILE, then stop",
    )
    parser.add_argument("--quick", action="store_true", help="--calibrate on fewer, smaller shapes")
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        default=None,
        help="h100 (the default) or h200: the per-phase calibration of that GPU's measured run "
        "(radio_lit/planning/calibration*.yaml); or FILE of --calibrate: each operation's "
        "shapes priced on its measured curves",
    )
    parser.add_argument(
        "--compare-layouts",
        action="store_true",
        help="plan each stage also with every partition on every rank (the balanced layout: "
        "model.partitions.<name>.every_rank true), unpacked and packed (model.student_packing), "
        "side by side with the configured one",
    )
    parser.add_argument("--cache-dtype", choices=list(DTYPES), default="float32")
    return parser


def main(argv: Sequence[str]) -> None:
    """Entry point of ``radio-lit plan``."""
    parser = _parser()
    args, overrides = parser.parse_with_overrides(argv)
    if args.calibrate is not None:
        _calibrate(args.calibrate, args.quick)
        return
    if not (args.config or args.stages):
        parser.error("one of --config, --stages or --calibrate is required")
    gpu = device(args.gpu)
    fit = load_calibration(args.calibration)
    if isinstance(fit, TimeModel):  # a file of another GPU of devices.yaml: to --gpu's peaks
        fit = fit.on(args.gpu)
    if args.gpus is not None and min(args.gpus) < 1:
        parser.error(f"--gpus must be positive numbers of GPUs, got {args.gpus}")
    if args.step is not None and args.step < 0:
        parser.error(f"--step must be a training step >= 0, got {args.step}")
    stages = [[c] for c in args.stages] if args.stages else [args.config]
    for files in stages:
        for config in files:
            if not Path(config).is_file():
                parser.error(f"--config {config}: no such config file")
    counts = args.gpus or [None]
    # [stage][N x layout]: with --compare-layouts, the configured layout then the others
    blocks = BlockRecords()  # each distinct block call counted once, across every stage's count
    plans = [_plan(files, overrides, args, gpu, fit, counts, blocks) for files in stages]
    layouts = len(plans[0]) // len(counts)
    by_count = list(zip(*plans, strict=True))  # [N x layout][stage]
    totals = [recipe_total(p) if len(stages) > 1 else None for p in by_count]
    if args.json:
        out: list[Any] = []
        for recipe, total in zip(by_count, totals, strict=True):
            stages_out: Any = [p.as_dict() for p in recipe]
            out.append(stages_out[0] if not args.stages else {"stages": stages_out, "total": total})
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return
    texts = []
    for recipe, total in zip(by_count, totals, strict=True):
        texts += [table(p) for p in recipe]
        if total is not None and total["gpu_hours"] is not None:
            texts[-1] += (
                f"\nrecipe ({len(recipe)} stages) at {recipe[0].gpus} GPUs: "
                f"{total['gpu_hours']:,.0f} GPU-hours, {total['wall_hours']:,.1f} h wall"
            )
    if args.compare_layouts:  # each stage's configured layout, then the others
        for first in range(0, len(by_count), layouts):
            group = by_count[first : first + layouts]  # [layout][stage]
            texts += [comparison(*each) for each in zip(*group, strict=True)]
    print("\n\n".join(texts))


def _calibrate(path: str, quick: bool) -> None:
    """``--calibrate FILE``: measure this device into FILE (:mod:`radio_lit.planning.calibrate`)."""
    from radio_lit.planning.calibrate import write_calibration

    folder = Path(path).parent  # said before minutes of measuring, not after
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--calibrate {path}: cannot create its folder ({error})") from error
    if Path(path).is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"--calibrate {path}: not a writable file path; pick another FILE")
    content = write_calibration(path, quick=quick)
    measured = content["measured"]
    print(
        f"calibration of {content['device']} written to {path} in {measured['seconds']} s "
        f"({measured['timer']}, {measured['threads']} threads); use it: radio-lit plan "
        f"--config ... --calibration {path}"
    )


class _PlanCLI(RadioLitCLI):
    """radio-lit's CLI with teachers and students built on the meta device."""

    def instantiate_classes(self) -> None:
        from radio_lit.students import Student
        from radio_lit.teachers import Teacher

        for kind in (Teacher, Student):
            self.parser.add_instantiator(on_meta, kind)
        super().instantiate_classes()


def _build(files: Sequence[str], overrides: Sequence[str], depth: int | None) -> tuple[Any, dict]:
    """The run of ``files`` + ``overrides`` (its CLI) and its raw YAML; what building prints
    goes to standard error (standard output is the plan's: ``--json``)."""
    with contextlib.redirect_stdout(sys.stderr):
        return _built(files, overrides, depth)


def _built(files: Sequence[str], overrides: Sequence[str], depth: int | None) -> tuple[Any, dict]:
    raw = merged(files)
    model = raw.get("model") or {}
    extra: list[str] = []
    for name, entry in (model.get("teachers") or {}).items():
        if isinstance(entry, dict):
            extra += random_weight_overrides(name, entry, False, depth)
    student = (model.get("student") or {}).get("init_args") or {}
    if student.get("pretrained"):
        extra.append("--model.student.init_args.pretrained=false")
    data = (raw.get("data") or {}).get("init_args") or {}
    extra += [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.num_nodes=1",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        "--data=radio_lit.data.SyntheticDataModule",
        f"--data.init_args.crop_size={int(data.get('crop_size', 256))}",
        f"--data.init_args.batch_size={int(data.get('batch_size', 8))}",
    ]
    if "class_path" not in model:  # a DistillationModule: an earlier stage's weights unread
        extra.append("--model.init_from=null")
    args = [a for f in files for a in ("--config", f)] + extra + list(overrides)
    with warnings.catch_warnings(), planning_build():
        warnings.simplefilter("ignore")
        cli = _PlanCLI(run=False, args=args)
    if depth is not None:
        for name, built in cli.model.teachers.items():
            shorten_trunk(name, built, depth)
    return cli, raw


def _reduce_scatter(module: Any, shards: int) -> tuple[int, int]:
    """FSDP2's reduce-scatter buffers of the student and its EMA-free trainable parameters:
    ``(input, output)`` bytes (:func:`~radio_lit.planning.counting.count_step`)."""
    values = sum(p.numel() for _, p in module.trainable_parameters())
    reduce = 2 if module.fsdp2.reduce_dtype == "bfloat16" else 4
    return values * reduce, values * 4 // shards


def _callback_steps(raw: dict[str, Any], callback: type) -> int:
    """``steps`` of ``callback`` (``FreezeBody``, ``TeacherStatsEstimation``) among the
    config's callbacks, its default where the config leaves it (0 without the callback)."""
    default = inspect.signature(callback).parameters["steps"].default
    for entry in (raw.get("trainer") or {}).get("callbacks") or []:
        if isinstance(entry, dict) and str(entry.get("class_path", "")).endswith(callback.__name__):
            return int((entry.get("init_args") or {}).get("steps", default))
    return 0


def _world(raw: dict[str, Any]) -> int:
    trainer = raw.get("trainer") or {}
    devices = trainer.get("devices", 1)
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    return devices * int(trainer.get("num_nodes") or 1)


def _distinct_ranks(module: Any, gpus: int) -> list[int]:
    try:
        return distinct_ranks(module.partitions, gpus)
    except ValueError as error:
        raise ConfigError(f"--gpus {gpus}: {error}") from error


def _plan(
    files: Sequence[str],
    overrides: Sequence[str],
    args: Any,
    gpu: Any,
    fit: Any,
    gpu_counts: Sequence[int | None],
    blocks: BlockRecords,
) -> list[StagePlan]:
    """The stage of ``files`` + ``overrides`` planned at each of ``gpu_counts`` (``None``: the
    config's devices x num_nodes), built once; its blocks replayed from ``blocks``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cli, raw = _build(files, overrides, args.teacher_depth)
    module, trainer = cli.model, cli.trainer
    if not hasattr(module, "partitions"):
        raise ConfigError(
            f"--config {files[0]}: radio-lit plan plans distillation runs "
            f"(DistillationModule), not {type(module).__name__}"
        )
    precision = str(trainer.precision)
    autocast = {"bf16": torch.bfloat16, "16": torch.float16}
    low = next((d for p, d in autocast.items() if precision.startswith(p)), None)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_module(module, mode)
    sharded = strategy_name(trainer) == "FSDP2"
    gathered = (low or torch.float32) if sharded else None  # its MixedPrecisionPolicy's
    datamodule = cli.datamodule
    optimizer = (raw.get("model") or {}).get("optimizer") or {"class_path": "AdamW"}
    from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation

    freeze, estimation = (_callback_steps(raw, c) for c in (FreezeBody, TeacherStatsEstimation))
    loop = LoopStep(args.step, freeze, estimation)
    previous = loop.updated_bytes(module)  # the earlier step's gradients, through the forward
    configured, packing = module.partitions, module.student_step.packing
    layouts = [(configured, packing)]
    if args.compare_layouts:
        layouts = compared_layouts(configured, packing, module.student)
    for given, (partitions, _) in itertools.product(gpu_counts, layouts):
        module.partitions = partitions  # a batch that does not split: said before counting
        _distinct_ranks(module, given or _world(raw))
    module.partitions = configured
    stages = []
    for given, (partitions, packed) in itertools.product(gpu_counts, layouts):
        module.partitions, module.student_step.packing = partitions, packed
        gpus = given or _world(raw)
        shards = gpus if sharded else 1  # FSDP2: each rank's shard of them
        scatter = _reduce_scatter(module, shards) if sharded else (0, 0)
        counts, draws = {}, {}
        for rank in _distinct_ranks(module, gpus):
            module.partitions.place(gpus, rank)
            batch = module.partitions.rank_batch_size() or datamodule.batch_size
            count = functools.partial(
                count_step,
                module,
                mode,
                datamodule.crop_size,
                batch,
                low,
                gpus,
                rank,
                gathered=gathered,
                previous_gradients=previous // shards,
                trunk_frozen=loop.trunk_frozen,
                estimating=loop.estimating,
                reduce_scatter=scatter,
                blocks=blocks,
            )
            counts[rank] = count()
            largest = largest_draws(module.partitions)
            draws[rank] = {  # the step time over the draws: each other resolution once
                (name, index): fit.cost(count(draws={name: index}))
                for name in counts[rank].images
                for index in range(len(module.partitions.resolutions[name]))
                if index != largest[name] and not args.largest_draws
            }
        strategy = strategy_name(trainer)
        strategy = "DDP" if gpus > 1 and strategy == "one device" else strategy
        images = args.cache_images or IMAGENET_TRAIN
        stated = assumptions(
            raw,
            trainer,
            strategy,
            gpus,
            given is not None,
            images,
            args.cache_images is not None,
            fit,
            args.gpu,
            overrides,
        )
        kernel = next((c.packed_kernel for c in counts.values() if c.packed_kernel), None)
        if kernel is not None:
            stated.append(packed_assumption(packed, kernel))
        stages.append(
            plan_stage(
                module,
                trainer,
                counts,
                draws=draws,
                loop=loop,
                config=" ".join(files),
                gpus=gpus,
                device=gpu,
                fit=fit,
                optimizer=optimizer,
                data_batch=datamodule.batch_size,
                crop_size=datamodule.crop_size,
                cache_images=images,
                cache_dtype=DTYPES[args.cache_dtype],
                assumptions=stated,
                gpu_key=args.gpu,
            )
        )
    module.partitions, module.student_step.packing = configured, packing
    return stages
