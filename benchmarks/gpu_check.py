"""Run this first on any lent GPU: every shipped config built and stepped, in one table.

Every YAML under ``configs/`` (the stage configs, every recipe, every quickstart, and each
overlay stacked on the config it documents) is built with radio-lit's own ``RadioLitCLI``
(:func:`benchmarks.harness.build`: random weights, nothing downloaded) on one device,
trained for ``--warmup`` + ``--steps`` optimizer steps with the config's own Trainer,
strategy (one rank), precision and callbacks (no logger, no checkpoints), and reported as
one line: pass/fail, median step time, peak memory and what was changed to fit one device.

Sizes (``--device cuda``, the default): the student at its real architecture and widths, the
partitions' batches one GPU's share of the recipe's (what rank 0 of the recipe's world takes
from each partition, all partitions on the one device), the recipe's resolutions; teachers at
their real widths, shortened to ``--teacher-depth`` blocks (SigLIP's open_clip timm trunk
cannot be shortened and keeps its depth; SAM3 is built from transformers' default config, its
real architecture); the quickstarts as shipped. ``--device cpu``: the same code at CPU size:
tiny teachers of the same families, a student of the same family shrunk to 2 blocks of width
64, 2 images per partition at 32-64 px, float32; the tests build every config this way
(``tests/configs/``).

    python benchmarks/gpu_check.py                    # on a lent GPU (aim: <= 6 min on an H100)
    python benchmarks/gpu_check.py --device cpu       # anywhere: tiny sizes (~1-2 min)
    python benchmarks/gpu_check.py --only c-radio     # the configs whose name contains c-radio

A module the machine lacks (jsonargparse, kornia, open_clip, segment-anything, webdataset,
torchdata...) is named with the package to install, once at start for the CLI's own imports,
per config for a teacher family's.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import merged, override  # noqa: E402

#: pip packages of the modules radio-lit imports that a bare GPU machine may lack.
PACKAGES = {
    "jsonargparse": "jsonargparse[signatures]",
    "open_clip": "open_clip_torch",
    "segment_anything": "segment-anything",
    "kornia": "kornia",
    "webdataset": "webdataset",
    "torchdata": "torchdata",
    "lightning": "lightning",
    "timm": "timm",
    "transformers": "transformers",
}
#: Blocks each teacher keeps on a GPU (``--teacher-depth``): DINOv3-7B's 40 blocks alone would
#: take most of the 6 minutes' build and step time; 8 blocks keep every width and layer type.
GPU_TEACHER_DEPTH = 8
#: The CPU student: the config's timm family, 2 blocks of width 64 (2 heads).
CPU_STUDENT = {"depth": 2, "embed_dim": 64, "num_heads": 2}
#: CPU sides (px): a partition with several resolutions draws among these, else the last.
CPU_RESOLUTIONS = (32, 64)
CPU_IMAGES_PER_PARTITION = 2
CPU_CROP = 128  # covers the tiny SAM canvases (128 px, SAM3: 112 px)


# ------------------------------------------------------------------------------------------
# the shipped configs
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShippedConfig:
    """One shipped YAML as ``radio-lit fit`` takes it: ``files`` is ``(path,)`` for a full
    config, ``(base, path)`` for an overlay (:func:`radio_lit.cli.overlays` finds its base)."""

    path: Path
    files: tuple[Path, ...]

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT / "configs"))

    @property
    def overlay(self) -> bool:
        return len(self.files) > 1


def shipped_configs(root: Path = ROOT) -> list[ShippedConfig]:
    """Every YAML under ``configs/`` (found by globbing, so none is forgotten)."""
    from radio_lit.cli.overlays import _base_of

    found = []
    for path in sorted((root / "configs").rglob("*.yaml")):
        raw = harness.load_config(path)
        model = raw.get("model") or {}
        if "data" in raw and (own_module(raw) or (model.get("teachers") and model.get("student"))):
            found.append(ShippedConfig(path, (path,)))
            continue
        base = Path(_base_of(path))  # an overlay's comments name its base from the root
        found.append(ShippedConfig(path, ((base if base.is_absolute() else root / base), path)))
    return found


def own_module(raw: dict[str, Any]) -> bool:
    """Whether a config names a LightningModule of its own (``model: class_path: ...``, e.g.
    ``configs/featsharp/``: a FeatSharp upsampler's training) rather than a distillation."""
    return "class_path" in (raw.get("model") or {})


def config_teachers(raw: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """``{name: (config key, entry)}`` of a config's teachers: ``model.teachers.<name>``, or
    the ``teacher`` of a module of its own (:func:`own_module`)."""
    model = raw.get("model") or {}
    if own_module(raw):
        teacher = (model.get("init_args") or {}).get("teacher")
        return {} if teacher is None else {"teacher": ("--model.init_args.teacher", teacher)}
    return {n: (f"--model.teachers.{n}", e) for n, e in (model.get("teachers") or {}).items()}


def stage_chains(configs: Sequence[ShippedConfig]) -> dict[str, list[ShippedConfig]]:
    """The multi-stage recipes, ``{folder: [stage1, stage2, ...]}`` (``stage<k>.yaml`` files of
    one folder, in order; each later stage starts from the one before with ``model.init_from``)."""
    chains: dict[str, list[ShippedConfig]] = {}
    for config in configs:
        stem = config.path.stem
        if stem.startswith("stage") and stem[5:].isdigit() and not config.overlay:
            folder = str(config.path.parent.relative_to(ROOT))
            chains.setdefault(folder, []).append(config)
    for stages in chains.values():
        stages.sort(key=lambda c: int(c.path.stem[5:]))
    return {k: v for k, v in chains.items() if len(v) > 1}


# ------------------------------------------------------------------------------------------
# sizes
# ------------------------------------------------------------------------------------------
def tiny_teacher_overrides(key: str, entry: Any) -> list[str]:
    """Command-line overrides that replace one teacher entry (at config key ``key``, e.g.
    ``--model.teachers.sam3``) by a tiny model of the same family: the same class, hence
    the same name and summary/no-summary, with the test suite's tiny sizes
    (``tests/teachers/tiny.py``). A teacher the config already sizes itself (``model_cfg``,
    ``model_kwargs``, ``encoder_kwargs``) is kept; a wrapper's inner teacher is shrunk alike.
    Random weights come from :func:`benchmarks.harness.build` (no tag, no file)."""
    from tests.teachers.tiny import (
        TINY_CLIP_CFG,
        TINY_SAM3_CONFIG,
        TINY_SAM_ENCODER,
        TINY_SIGLIP_CFG,
    )

    if not isinstance(entry, dict):
        return []
    kind = str(entry.get("class_path", "")).rsplit(".", 1)[-1]
    init = entry.get("init_args") or {}
    args = f"{key}.init_args"
    if kind == "UpsampledTeacher":  # an untrained upsampler of the tiny teacher
        return [
            f"{args}.checkpoint=null",
            *tiny_teacher_overrides(f"{args}.teacher", init["teacher"]),
        ]
    if isinstance(init.get("teacher"), dict):  # RescaledTeacher, FixedPatternTeacher
        return tiny_teacher_overrides(f"{args}.teacher", init["teacher"])
    if any(init.get(k) for k in ("model_cfg", "model_kwargs", "encoder_kwargs")):
        return []
    if kind == "OpenCLIPTeacher":
        import open_clip

        real = open_clip.get_model_config(init["model_name"]) or {}
        vision = real.get("vision_cfg", {})
        if "timm_model_name" in vision:  # SigLIP / SigLIP2: a timm trunk, MAP-pooled
            cfg = copy.deepcopy(TINY_SIGLIP_CFG)
            cfg["vision_cfg"]["timm_pool"] = vision.get("timm_pool", "")
        else:
            cfg = TINY_CLIP_CFG
        return [override(f"{args}.model_cfg", cfg)]
    if kind in ("DINOv2Teacher", "DINOv3Teacher", "TimmTeacher"):
        if init.get("backend", "timm") != "timm":
            raise ValueError(f"{key}: no tiny stand-in for a {kind} on {init['backend']}")
        return [override(f"{args}.model_kwargs", {"depth": 1, "embed_dim": 32, "num_heads": 2})]
    if kind == "SAMTeacher":
        return [f"{args}.model_type=null", override(f"{args}.encoder_kwargs", TINY_SAM_ENCODER)]
    if kind == "RADIOTeacher":  # one tiny export with every adaptor name the configs use
        from tests.export.tiny_export import tiny_radio_export

        return [
            f"{args}.model={tiny_radio_export()}",
            f"{args}.loader=export",
            f"{args}.backend=native",
            f"{args}.trust_remote_code=false",
        ]
    if kind == "SAM3Teacher":
        return [
            f"{args}.model=sam3_vision_model",
            f"{args}.pretrained=false",
            override(f"{args}.model_kwargs", TINY_SAM3_CONFIG),
        ]
    raise ValueError(
        f"{key}: no tiny stand-in for {kind}; add one to benchmarks/gpu_check.py "
        "(tiny_teacher_overrides) so that configs using it are built by the tests"
    )


def radio_stand_in_overrides(raw: dict[str, Any]) -> list[str]:
    """For a config whose student starts as the model its ``RADIOTeacher`` entries serve
    (``model.init_from`` is their file: ``configs/recipes/{adapt,extend}``), overrides that
    load both from one tiny export with the adaptor heads the entries name
    (:func:`tests.published_stand_in.radio_stand_in`, the quickstart student's architecture),
    read by ``loader: export``; ``[]`` for other configs (their RADIO teachers are
    :func:`tiny_teacher_overrides`')."""
    from tests.published_stand_in import radio_stand_in

    entries = {
        key: entry
        for key, entry in config_teachers(raw).values()
        if str(entry.get("class_path", "")).endswith("RADIOTeacher")
    }
    inits = {key: entry.get("init_args") or {} for key, entry in entries.items()}
    init_from = (raw.get("model") or {}).get("init_from")
    if not inits or init_from not in {i.get("model") for i in inits.values()}:
        return []
    adaptors = sorted({i.get("adaptor", "backbone") for i in inits.values()} - {"backbone"})
    path = radio_stand_in(tuple(adaptors))
    out = []
    for key in entries:
        args = f"{key}.init_args"
        out += [f"{args}.model={path}", f"{args}.loader=export", f"{args}.backend=native"]
        out.append(f"{args}.trust_remote_code=false")
    return [*out, f"--model.init_from={path}"]


def short_teacher_overrides(key: str, entry: Any, depth: int) -> list[str]:
    """What :func:`benchmarks.harness.build`'s ``teacher_depth`` does not cover: SAM3
    from transformers' default ``Sam3VisionConfig`` (SAM3's own architecture; no download)
    with ``depth`` blocks, the last global."""
    kind = str((entry or {}).get("class_path", "")).rsplit(".", 1)[-1]
    if kind != "SAM3Teacher" or (entry.get("init_args") or {}).get("model_kwargs"):
        return []
    backbone = {"model_type": "sam3_vit_model", "num_hidden_layers": depth}
    backbone["global_attn_indexes"] = [depth - 1]
    return [
        f"{key}.init_args.model=sam3_vision_model",
        f"{key}.init_args.pretrained=false",
        override(f"{key}.init_args.model_kwargs", {"backbone_config": backbone}),
    ]


def cpu_student_overrides(raw: dict[str, Any]) -> list[str]:
    """The config's student family shrunk to CPU size (:data:`CPU_STUDENT`; ViTDet windows of
    2 tokens so that they tile the CPU grids). Its token layout and options are kept."""
    student = (raw.get("model") or {}).get("student") or {}
    if not str(student.get("class_path", "")).endswith("CPEViT"):
        return []  # E-RADIO: the quickstart's is tiny already
    init = student.get("init_args") or {}
    key = "--model.student.init_args"
    out = [override(f"{key}.model_kwargs", {**(init.get("model_kwargs") or {}), **CPU_STUDENT})]
    if init.get("vitdet_window_sizes"):
        out += [override(f"{key}.vitdet_window_sizes", [2]), f"{key}.vitdet_num_windowed=1"]
    return out


def world_size(raw: dict[str, Any]) -> int:
    trainer = raw.get("trainer") or {}
    devices = trainer.get("devices", 1)
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    return devices * int(trainer.get("num_nodes") or 1)


def one_rank_partitions(raw: dict[str, Any], cpu: bool) -> dict[str, dict[str, Any]] | None:
    """``model.partitions`` for one device: each partition's batch is what one rank of the
    recipe's world takes from it (``--device cpu``: :data:`CPU_IMAGES_PER_PARTITION`, and
    :data:`CPU_RESOLUTIONS`); ``None`` without partitions."""
    from radio_lit.training.partitions import Partition, PartitionPlan

    model = raw.get("model") or {}
    given = model.get("partitions")
    if not given:
        return None
    parts = {name: Partition(**spec) for name, spec in given.items()}
    plan = PartitionPlan(parts, list(model.get("teachers") or {}), (16, 16), 1)
    placement = plan.place(world_size(raw), 0)
    fitted = {}
    for name, spec in given.items():
        spec = dict(spec)
        share = spec.get("batch_size")
        if share is not None:
            share = max(share // len(placement.ranks[name]), 1)
        spec["batch_size"] = CPU_IMAGES_PER_PARTITION if cpu else share
        if cpu and spec.get("resolutions"):
            several = len(spec["resolutions"]) > 1
            spec["resolutions"] = list(CPU_RESOLUTIONS if several else CPU_RESOLUTIONS[-1:])
            spec["probabilities"] = None
        if cpu and spec.get("eval_resolution"):
            spec["eval_resolution"] = CPU_RESOLUTIONS[-1]
        fitted[name] = spec
    return fitted


def one_device_overrides(raw: dict[str, Any], size: str, keep_strategy: bool) -> list[str]:
    """Trainer, partitions and data for one device: one rank of the config's strategy (or
    ``auto``), no logger or checkpoints (and so no ``LearningRateMonitor`` or
    ``ModelCheckpoint``), synthetic images. ``size`` (see :func:`build`): ``"real"`` fits the
    partitions to one device (:func:`one_rank_partitions`); ``"cpu"`` shrinks them, the
    resolutions and the crop (:data:`CPU_CROP`) and trains in float32; ``"build"`` keeps
    them as configured (the recipe's world, for placing them)."""
    trainer = raw.get("trainer") or {}
    out, _ = harness.one_device(raw, strategy="one rank" if keep_strategy else "auto")
    out.append("--trainer.enable_checkpointing=false")
    out.append(override("--trainer.callbacks", training_callbacks(trainer.get("callbacks"))))
    data = (raw.get("data") or {}).get("init_args") or {}
    batch = int(data.get("batch_size", 8))
    partitions = one_rank_partitions(raw, cpu=size == "cpu") if size != "build" else None
    if partitions is not None:
        out.append(override("--model.partitions", partitions))
        batch = sum(p["batch_size"] for p in partitions.values())
    elif size == "cpu":
        batch = CPU_IMAGES_PER_PARTITION
    if size == "cpu":  # torch's CPU kernels lack bf16 antialiased resizing: float32 steps
        out.append("--trainer.precision=32-true")
        if not own_module(raw):
            out.append(f"--model.student_resolution={CPU_RESOLUTIONS[-1]}")
    crop = CPU_CROP if size == "cpu" else int(data.get("crop_size", 256))
    out += ["--data=radio_lit.data.SyntheticDataModule", f"--data.init_args.crop_size={crop}"]
    out += [f"--data.init_args.batch_size={batch}", "--data.init_args.num_workers=0"]
    out.append(f"--data.init_args.num_samples={max(64, batch)}")  # one batch at least
    return out


def training_callbacks(callbacks: Any) -> list[dict[str, Any]]:
    """The config's callbacks that take part in training steps: not ``LearningRateMonitor``
    or ``ModelCheckpoint`` (no logger, no checkpoints), nor the evaluations that run when
    training ends (``radio_lit.evaluation``: kNN, zero-shot, segmentation probe...)."""
    unlogged = ("LearningRateMonitor", "ModelCheckpoint")
    kept = [c for c in callbacks or [] if isinstance(c, dict)]
    kept = [c for c in kept if not str(c.get("class_path", "")).endswith(unlogged)]
    return [c for c in kept if not str(c.get("class_path", "")).startswith("radio_lit.evaluation")]


def without_saved_config(cli: Any) -> Any:
    """``cli`` whose trainer does not write the run's ``config.yaml`` when it starts (nothing
    of a check is kept); the config was parsed and built all the same."""
    from lightning.pytorch.cli import SaveConfigCallback

    callbacks = cli.trainer.callbacks
    callbacks[:] = [c for c in callbacks if not isinstance(c, SaveConfigCallback)]
    return cli


@contextlib.contextmanager
def students_on(device: str | None) -> Iterator[None]:
    """Build CPE ViT students' timm trunks on ``device`` (``"meta"``: shapes only, the real
    architecture at no cost, timm's weight initialisation skipped: on the meta device it
    computes nothing but takes ~0.25 CPU-s per ViT-L in torch's Python reference kernels;
    ``None``: as configured)."""
    if device is None:
        yield
        return
    import torch

    import radio_lit.students.cpe_vit as cpe_vit

    original = cpe_vit._timm_vit

    def on_device(name: str, pretrained: bool, kwargs: dict[str, Any]) -> Any:
        if device == "meta":
            kwargs = {**kwargs, "weight_init": "skip"}
        with torch.device(device):
            return original(name, pretrained, kwargs)

    cpe_vit._timm_vit = on_device
    try:
        yield
    finally:
        cpe_vit._timm_vit = original


def size_overrides(
    config: ShippedConfig, size: str, teacher_depth: int | None, keep_strategy: bool = True
) -> list[str]:
    """The command-line overrides :func:`build` gives ``config`` at ``size`` (see there): its
    later config files, the teachers', the student's and one device's."""
    raw = merged(config.files)
    overrides: list[str] = [a for f in config.files[1:] for a in ("--config", str(f))]
    for key, entry in config_teachers(raw).values():
        if size in ("cpu", "build"):
            overrides += tiny_teacher_overrides(key, entry)
        elif teacher_depth is not None:
            overrides += short_teacher_overrides(key, entry, teacher_depth)
    # a student that starts as its RADIO teachers' model: both from one stand-in, at any size
    overrides += radio_stand_in_overrides(raw)
    if size == "cpu":
        overrides += cpu_student_overrides(raw)
    return overrides + one_device_overrides(raw, size, keep_strategy)


def build(
    config: ShippedConfig,
    *,
    device: str = "cpu",
    size: str = "cpu",
    teacher_depth: int | None = None,
    keep_strategy: bool = True,
    student_device: str | None = None,
    build_on_host: bool = False,
    extra: Sequence[str] = (),
) -> Any:
    """``config`` built by ``RadioLitCLI`` (:func:`benchmarks.harness.build`) for one
    ``device``. ``size``: ``"real"`` (the real widths, teachers shortened to ``teacher_depth``,
    one device's share of every partition), ``"cpu"`` (tiny teachers, the CPU student, CPU
    partitions and resolutions: :func:`cpu_sizes`) or ``"build"`` (tiny teachers, the student,
    partitions and resolutions as configured: with ``student_device="meta"`` the real
    architecture of a GPU recipe's student at no cost); at every size a student that starts
    as its RADIO teachers' model starts from their stand-in (:func:`radio_stand_in_overrides`).
    The models are created on ``device``
    unless ``build_on_host`` (:func:`benchmarks.harness.on_device`). ``extra``: more
    command-line overrides (they come last and win; one training step unless they say
    otherwise)."""
    overrides = size_overrides(config, size, teacher_depth, keep_strategy)
    with students_on(student_device):
        cli = harness.build(
            config.files[0],
            [*overrides, *extra],
            max_steps=1,
            device=device,
            teacher_depth=teacher_depth if size == "real" else None,
            build_on_host=build_on_host,
        )
    return without_saved_config(cli)


# ------------------------------------------------------------------------------------------
# the check
# ------------------------------------------------------------------------------------------
@dataclass
class Row:
    config: str
    ok: bool = False
    step_ms: float | None = None
    memory_gib: float | None = None
    notes: list[str] = field(default_factory=list)


class StepTimes:
    """A Lightning callback: the wall time of every training batch (device-synchronised)."""

    def __init__(self, sync: Any) -> None:
        self.sync, self.times, self.start = sync, [], 0.0

    def callback(self) -> Any:
        from lightning.pytorch.callbacks import Callback

        outer = self

        class _Times(Callback):
            def on_train_batch_start(self, *_: Any) -> None:
                outer.sync()
                outer.start = time.perf_counter()

            def on_train_batch_end(self, *_: Any) -> None:
                outer.sync()
                outer.times.append(time.perf_counter() - outer.start)

        return _Times()


def missing_module(error: BaseException) -> str | None:
    """The module an import failed on, anywhere in ``error``'s chain, with its package."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.split(".")[0]
            return f"missing module {top} (pip install {PACKAGES.get(top, top)})"
        seen = seen.__cause__ or seen.__context__
    return None


def cpu_sized(config: ShippedConfig) -> bool:
    """Whether ``config`` is sized for a CPU as shipped (``trainer.accelerator: cpu``: the
    quickstarts and ablations), so that it runs as it is, on any device."""
    return (merged(config.files).get("trainer") or {}).get("accelerator") == "cpu"


def check(
    config: ShippedConfig, args: argparse.Namespace, init_from: str | None, save: Path | None
) -> Row:
    """Build ``config`` (starting from ``init_from`` when the config starts from an earlier
    stage), train ``warmup + steps`` steps, measure (peak memory: CUDA's largest allocation
    since the config started; on a CPU the process's peak resident memory so far), save the
    weights to ``save`` (for the next stage); any error fails the row, its first line the
    note."""
    import torch

    row = Row(config.name)
    cuda = args.device == "cuda"
    shipped = cpu_sized(config)
    size = "build" if shipped else "real" if cuda else "cpu"
    depth = args.teacher_depth if size == "real" else None
    sync = harness.synchronizer(torch.device(args.device))
    steps = args.warmup + args.steps
    cli = None
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        extra = [f"--trainer.max_steps={steps}", f"--trainer.accelerator={args.device}"]
        if (merged(config.files).get("model") or {}).get("init_from"):
            extra.append(f"--model.init_from={init_from or 'null'}")
            row.notes.append(f"from {Path(init_from).stem}" if init_from else "init_from: none")
        try:
            cli = build(config, device=args.device, size=size, teacher_depth=depth, extra=extra)
        except Exception as error:  # a library that cannot build under a GPU default device
            if not cuda:
                raise
            gc.collect()
            on_host = dict(size=size, teacher_depth=depth, build_on_host=True)
            cli = build(config, device="cuda", extra=extra, **on_host)
            row.notes.append(f"built on the host: on the GPU, {_first_line(error)}")
        times = StepTimes(sync)
        cli.trainer.callbacks.append(times.callback())
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        if len(times.times) < steps:
            raise RuntimeError(f"trained {len(times.times)} of {steps} steps")
        row.step_ms = 1e3 * statistics.median(times.times[args.warmup :])
        if cuda:
            row.memory_gib = torch.cuda.max_memory_allocated() / 2**30
        else:
            row.memory_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if save is not None:
            cli.trainer.save_checkpoint(save)
        row.ok = True
        row.notes.insert(0, _sizes_note(cli, depth, size))
    except Exception as error:  # a failed config is a row, not the end of the check
        row.notes.insert(0, missing_module(error) or _first_line(error))
    finally:
        if cli is not None:
            shutil.rmtree(cli.trainer.default_root_dir, ignore_errors=True)
        del cli
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return row


def _first_line(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"[:160]


def _sizes_note(cli: Any, depth: int | None, size: str) -> str:
    model = cli.model
    if not hasattr(model, "student"):  # a module of its own (configs/featsharp): an upsampler
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6
        batch = cli.datamodule.batch_size
        return f"{type(model).__name__}, {trained:.2f}M trained params, batch {batch}"
    params = sum(p.numel() for p in model.student.parameters()) / 1e6
    shards = model.partitions.partitions
    batch = sum(p.batch_size or 0 for p in shards.values()) or cli.datamodule.batch_size
    parts = f"{len(shards)} partition(s), batch {batch}, {type(cli.trainer.strategy).__name__}"
    if size == "build":
        return f"as shipped; {parts}"
    if size == "cpu":
        return f"CPU sizes: student {params:.1f}M params, tiny teachers; {parts}"
    teachers = f"teachers {depth} blocks (open_clip timm trunks whole)"
    return f"student {params:.0f}M params; {teachers}; {parts}"


def print_table(rows: Sequence[Row], device: str) -> None:
    widths = [max(len("config"), *(len(r.config) for r in rows)), 6, 10, 10]
    header = ["config", "result", "step ms", "peak GiB", "note"]
    print("\n" + "  ".join(h.ljust(w) for h, w in zip(header, [*widths, 0], strict=True)))
    for row in rows:
        cells = [
            row.config,
            "pass" if row.ok else "FAIL",
            f"{row.step_ms:.1f}" if row.step_ms is not None else "-",
            f"{row.memory_gib:.2f}" if row.memory_gib is not None else "-",
        ]
        line = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        print(f"{line}  {'; '.join(row.notes)}")
    passed = sum(r.ok for r in rows)
    print(f"\n{passed} of {len(rows)} configs pass on {device}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=2, help="timed steps (median; default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps (default 1)")
    parser.add_argument("--teacher-depth", type=int, default=GPU_TEACHER_DEPTH)
    parser.add_argument("--only", default=None, help="configs whose name contains this")
    parser.add_argument(
        "--budget", type=float, default=330.0, help="seconds; later configs are skipped"
    )
    parser.add_argument(
        "--chain",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start each later stage from the earlier stage's weights, saved after its steps "
        "(default: on CPU only; a ViT-H checkpoint takes seconds to write and read)",
    )
    args = parser.parse_args(argv)
    try:
        import torch

        import radio_lit.cli.app  # noqa: F401  (jsonargparse, lightning, kornia, torchdata...)
    except ModuleNotFoundError as error:
        print(f"gpu_check: {missing_module(error)}: radio-lit cannot start without it")
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --device cpu")
        return 2
    harness.quiet()
    configs = [c for c in shipped_configs() if args.only is None or args.only in c.name]
    # quickstarts first: they are fast and say whether the machine works at all; then the
    # configs written for GPUs (what a lent GPU is for, ahead of the budget), the stages of a
    # recipe in order; the CPU-sized ablation rows last
    configs.sort(key=lambda c: (not c.name.startswith("quickstart"), cpu_sized(c), c.name))
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    chain = args.device == "cpu" if args.chain is None else args.chain
    stages = {c.path: c for chain_ in stage_chains(configs).values() for c in chain_}
    folder = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    saved: dict[Path, str] = {}  # a stage's folder -> its last saved checkpoint
    start, rows = time.perf_counter(), []
    for config in configs:
        if time.perf_counter() - start > args.budget:
            rows.append(Row(config.name, notes=[f"skipped: past the {args.budget:.0f} s budget"]))
            continue
        staged = chain and config.path in stages
        save = folder / f"{config.name.replace('/', '_')}.ckpt" if staged else None
        row = check(config, args, saved.pop(config.path.parent, None) if staged else None, save)
        if save is not None and row.ok:
            saved[config.path.parent] = str(save)
        print(f"{row.config}: {'pass' if row.ok else 'FAIL'} {'; '.join(row.notes)}", flush=True)
        rows.append(row)
    shutil.rmtree(folder, ignore_errors=True)
    print_table(rows, device)
    print(f"total {time.perf_counter() - start:.0f} s; torch {torch.__version__}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
