"""``radio-lit cache``: run a config's teachers once over its training data and store the views.

    radio-lit cache --config configs/quickstart.yaml --out cache/quickstart --views 8
    radio-lit fit --config configs/quickstart.yaml --data radio_lit.cache.CachedViews \\
        --data.path cache/quickstart

For every training item ``i`` (images, times the data's ``repeats``) and view ``v < views``
the writer draws the crop exactly as training draws item ``i`` in epoch ``v`` (the same
transform under the seed ``(seed, v, i)``, :mod:`radio_lit.data.resumable`), and runs every
teacher on it at every view size the run can show it (its native resolution, or one per
student resolution of its partitions if it follows the student), with the step's own code
(:func:`~radio_lit.step.run_teachers`), on the very batches a one-rank run of the config
forms in epoch ``v`` (same images, same rows). Stored per view: the crop (uint8, what the
student's view is made from) and each teacher's summary and features on its own grid, before
normalization, in ``--dtype``. The validation images of the run's ``val_dir`` (their fixed
center crops, in the validation loader's batches) are stored the same way, in one file, so a
run from the cache validates without its teachers. Layout: :mod:`radio_lit.cache.shards`,
:mod:`radio_lit.cache.manifest`.

The size is printed before anything is written, and the command refuses to start if the disk
lacks the room. Interrupted, it resumes: finished shards are kept, a partial one is rewritten.
Several processes write disjoint shards: ``--shard-index i --num-shards k`` (shards ``j`` with
``j mod k == i``), by default ``RANK`` / ``WORLD_SIZE`` of a ``torchrun`` launch.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_safetensors
from safetensors.torch import save_file
from torch import Tensor
from torch.utils.data import IterableDataset
from tqdm import tqdm
from webdataset import TarWriter

from radio_lit.cache.batch import output_key
from radio_lit.cache.manifest import (
    DTYPES,
    VAL_FILE,
    Manifest,
    epoch_order,
    teacher_signature,
    view_sizes,
)
from radio_lit.cache.shards import TAR_OPTIONS, sample_key, shard_is_complete, write_shard
from radio_lit.data.resumable import sample_seed, seeded
from radio_lit.data.views import as_float_images
from radio_lit.errors import CommandParser
from radio_lit.step import run_teachers

__all__ = ["main", "write_cache"]

#: Target size of one shard when --samples-per-shard is not given.
SHARD_BYTES = 256 * 2**20
#: Tar bytes beside the samples: the end-of-archive blocks and the record padding.
_TAR_END = 10240


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="radio-lit cache",
        description="Run a config's teachers over its training data once and store the views "
        "(crops and teacher outputs) for radio-lit fit with data: radio_lit.cache.CachedViews. "
        "Any other --section.key value option is applied to the config, as for radio-lit fit.",
    )
    parser.add_argument("--config", action="append", required=True, help="the run's config(s)")
    parser.add_argument("--out", type=Path, required=True, help="the cache folder")
    parser.add_argument(
        "--views",
        default="8",
        help="views per image (default: 8), or 'epochs': as many as the run has epochs, so "
        "that a run from the cache sees what the live run would (max_steps over the "
        "steps of an epoch on one rank)",
    )
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--samples-per-shard", type=int, default=None, help="default: ~256 MiB")
    parser.add_argument("--shard-index", type=int, default=int(os.environ.get("RANK", 0)))
    parser.add_argument("--num-shards", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    parser.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if any, else cpu")
    return parser


def main(argv: Sequence[str]) -> None:
    """Entry point of ``radio-lit cache``."""
    parser = _parser()
    args, overrides = parser.parse_with_overrides(argv)
    if args.views != "epochs" and not (args.views.isdigit() and int(args.views) >= 1):
        parser.error(f"--views must be a positive integer or 'epochs', got {args.views!r}")
    if not 0 <= args.shard_index < args.num_shards:
        parser.error(
            f"--shard-index {args.shard_index} must lie in [0, --num-shards {args.num_shards})"
        )
    for config in args.config:
        if not Path(config).is_file():
            parser.error(f"--config {config}: no such config file")
    cli = _build_run([a for config in args.config for a in ("--config", config)] + overrides)
    views = _run_epochs(cli) if args.views == "epochs" else int(args.views)
    write_cache(
        cli.model,
        cli.datamodule,
        cli.config.as_dict(),
        args.out,
        views=views,
        dtype=args.dtype,
        samples_per_shard=args.samples_per_shard,
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        device=args.device,
        precision=str(cli.trainer.precision),
        command="radio-lit cache " + " ".join(argv),
    )


def _build_run(args: list[str]) -> Any:
    """The run's model, data and trainer, built from its config (not run)."""
    from radio_lit.cli import RadioLitCLI

    with warnings.catch_warnings():  # args= is given on purpose, beside `radio-lit cache`
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return RadioLitCLI(args=[*args, "--trainer.logger", "false"], run=False)


def _run_epochs(cli: Any) -> int:
    """The number of epochs a one-rank run of ``cli``'s config starts (``max_steps``, else
    ``max_epochs``)."""
    trainer, datamodule = cli.trainer, cli.datamodule
    if trainer.max_steps is None or trainer.max_steps < 0:
        return max(1, int(trainer.max_epochs or 1))
    steps_per_epoch = len(datamodule.build_train_dataset()) // datamodule.batch_size
    return max(1, -(-trainer.max_steps // max(1, steps_per_epoch)))


def _device(device: str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


class _Recorder:
    """Runs the teachers on uint8 crops and returns each view's tensors (see the module
    docstring): ``{"pixels": [3, S, S], output_key: [h, w, C] or [C_s]}``.

    Each partition's teachers run on batches of the partition's size in a one-rank training
    step (the last batch padded), as the step runs them: some CPU kernels (a small matrix
    product) round differently for another number of rows, and a float32 cache must hold
    the very numbers a live step computes.
    """

    def __init__(
        self, module: Any, batch: int, device: torch.device, dtype: torch.dtype, precision: str
    ) -> None:
        self.teachers = module.teachers.to(device)
        self.plan = module.partitions
        self.patch = module.student.patch_size
        self.batch = batch
        self.device = device
        self.dtype = dtype
        half = {"bf16": torch.bfloat16, "16": torch.float16}
        autocast = next((d for p, d in half.items() if precision.startswith(p)), None)
        self.autocast = (
            torch.autocast(device.type, dtype=autocast)
            if autocast is not None and device.type == "cuda"
            else nullcontext()
        )

    def __call__(
        self, pixels: Tensor, rows: int | None = None, dtype: torch.dtype | None = None
    ) -> list[dict[str, Tensor]]:
        """Each crop's tensors; the teachers see ``rows`` crops at a time (default: the
        partition's training batch); outputs stored in ``dtype`` (default: the cache's)."""
        crop = as_float_images(pixels.to(self.device))
        stored: dict[str, Tensor] = {}
        with torch.no_grad(), self.autocast:
            for partition, members in self.plan.members.items():
                part_rows = rows or self.plan.partitions[partition].batch_size or self.batch
                for height, width in self.plan.resolutions[partition]:
                    grid = (height // self.patch, width // self.patch)
                    names = [
                        n
                        for n in members
                        if output_key(n, self.teachers[n].view_size(grid), "features") not in stored
                    ]
                    if names:
                        outputs = self._run(crop, names, grid, part_rows)
                        stored.update({k: v.to(dtype or self.dtype) for k, v in outputs.items()})
        return [
            {"pixels": pixels[i].contiguous(), **{k: v[i].contiguous() for k, v in stored.items()}}
            for i in range(pixels.shape[0])
        ]

    def _run(
        self, crop: Tensor, names: list[str], grid: tuple[int, int], rows: int
    ) -> dict[str, Tensor]:
        """The teachers ``names`` at the student grid ``grid``, ``rows`` images at a time."""
        parts: dict[str, list[Tensor]] = {}
        for start in range(0, crop.shape[0], rows):
            part = crop[start : start + rows]
            count = part.shape[0]
            if count < rows:  # pad with copies of the last image
                part = torch.cat([part, part[-1:].expand(rows - count, -1, -1, -1)])
            for name, out in run_teachers(self.teachers, part, names, grid).items():
                size = self.teachers[name].view_size(grid)
                for key, value in (("features", out.features), ("summary", out.summary)):
                    if value is not None:
                        parts.setdefault(output_key(name, size, key), []).append(
                            value[:count].cpu()
                        )
        return {key: torch.cat(values) for key, values in parts.items()}  # float32


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError


def _tar_bytes(payload: bytes) -> int:
    """Bytes one sample takes in a shard (tar headers and padding included), measured by
    writing it twice with the shards' own writer."""
    sizes = []
    for count in (1, 2):
        buffer = io.BytesIO()
        with TarWriter(buffer, **TAR_OPTIONS) as writer:
            for n in range(count):
                writer.write({"__key__": sample_key(n, 0), "safetensors": payload})
            sizes.append(writer.tarstream.offset)
    return sizes[1] - sizes[0]


def write_cache(
    module: Any,
    datamodule: Any,
    config: dict[str, Any],
    out: Path,
    views: int = 8,
    dtype: str = "float32",
    samples_per_shard: int | None = None,
    shard_index: int = 0,
    num_shards: int = 1,
    device: str | None = None,
    precision: str = "32-true",
    command: str = "",
) -> Manifest:
    """Write this process's shards of the cache of a run (``module``: its
    :class:`~radio_lit.module.DistillationModule`, ``datamodule`` its image datamodule,
    ``config`` its parsed config as a dict); returns the manifest."""
    dataset = datamodule.build_train_dataset()
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ValueError(
            f"radio-lit cache reads map-style training data (data: ImageFolderDataModule or "
            f"SyntheticDataModule), not {type(datamodule).__name__}'s streamed shards"
        )
    seed = datamodule.seed
    batch = datamodule.batch_size
    recorder = _Recorder(module, batch, _device(device), DTYPES[dtype], precision)
    num_items = len(dataset)

    orders: dict[int, list[int]] = {}

    def item(n: int) -> tuple[int, int]:
        """``(index, view)`` of sample ``n`` (the item at its place in its epoch's order)."""
        view, position = divmod(n, num_items)
        if view not in orders:
            orders[view] = epoch_order(num_items, seed, view)
        return orders[view][position], view

    def crops(samples: Sequence[int]) -> Tensor:
        items = []
        for index, view in map(item, samples):
            with seeded(sample_seed(seed, view, index)):  # as SeededSampler + SeededItems draw
                items.append(dataset[index])
        return torch.stack(items)

    val_batches = _val_batches(datamodule)
    probe = recorder(crops([0]))[0]
    sample_bytes = _tar_bytes(save_safetensors(probe))
    sizes = view_sizes(module.teachers, module.partitions, module.student.patch_size)
    teachers_config = config["model"]["teachers"]
    manifest = Manifest(
        teachers={
            name: {
                "config": teachers_config.get(name),
                "signature": teacher_signature(teacher),
                "sizes": [list(size) for size in sizes[name]],
                "shapes": {k: list(v.shape) for k, v in probe.items() if k.startswith(f"{name}/")},
            }
            for name, teacher in module.teachers.items()
        },
        data={
            "config": config["data"],
            "crop_size": datamodule.crop_size,
            "seed": seed,
            "num_items": num_items,
            "batch_size": datamodule.batch_size,
            "val_dir": datamodule.val_dir,
            "val_items": sum(len(batch) for batch in val_batches),
        },
        views=views,
        dtype=dtype,
        samples_per_shard=samples_per_shard or _shard_samples(sample_bytes, batch),
        sample_bytes=sample_bytes,
        bytes_per_view={
            "pixels": probe["pixels"].nbytes,
            **{
                name: sum(v.nbytes for k, v in probe.items() if k.startswith(f"{name}/"))
                for name in module.teachers
            },
        },
        created_by=command,
    )
    out.mkdir(parents=True, exist_ok=True)
    _check_existing(manifest, out)
    manifest.save(out)

    mine = [j for j in range(manifest.num_shards) if j % num_shards == shard_index]
    todo = [j for j in mine if not shard_is_complete(out, j, len(manifest.shard_samples(j)))]
    samples = sum(len(manifest.shard_samples(j)) for j in todo)
    need = samples * sample_bytes + len(todo) * _TAR_END
    val_path = out / VAL_FILE
    val_view = sum(v.numel() * (1 if k == "pixels" else 4) for k, v in probe.items())
    val_bytes = manifest.val_items * val_view  # float32
    if shard_index == 0 and not val_path.is_file():
        need += val_bytes
    total = manifest.num_samples * sample_bytes + manifest.num_shards * _TAR_END + val_bytes
    per_teacher = ", ".join(f"{k} {_human(v)}" for k, v in manifest.bytes_per_view.items())
    print(
        f"radio-lit cache: {num_items} items x {views} views = {manifest.num_samples} views "
        f"({dtype}); per view: {per_teacher}; total {_human(total)} in {manifest.num_shards} "
        f"shard(s); this process: {len(todo)} of its {len(mine)} shard(s) left, {_human(need)}",
        flush=True,
    )
    free = shutil.disk_usage(out).free
    if need > free:
        raise OSError(
            f"{out} needs {_human(need)} for the cache but its disk has {_human(free)} free: "
            "free some space or choose another --out (finished shards are kept)"
        )
    if shard_index == 0 and val_batches and not val_path.is_file():
        _write_val(val_path, val_batches, recorder)
    with tqdm(total=samples, unit="view", desc="radio-lit cache", file=sys.stderr) as progress:
        for shard in todo:
            write_shard(
                out,
                shard,
                _samples(
                    manifest.shard_samples(shard), batch, num_items, crops, item, recorder, progress
                ),
            )
    return manifest


def _val_batches(datamodule: Any) -> list[Tensor]:
    """The validation loader's batches ``[B, 3, S, S]`` uint8 (none without ``val_dir``)."""
    if datamodule.val_dir is None:
        return []
    datamodule.setup("validate")
    return list(datamodule.val_dataloader())


def _write_val(path: Path, batches: list[Tensor], recorder: _Recorder) -> None:
    """The validation views, every teacher on each validation batch as the validation step
    runs it (the whole batch at once), stacked into one safetensors file; in float32
    whatever the cache's dtype, so validation measures against the teachers' own numbers."""
    views = [view for batch in batches for view in recorder(batch, len(batch), torch.float32)]
    tensors = {key: torch.stack([view[key] for view in views]) for key in views[0]}
    partial = path.with_name(path.name + ".partial")
    save_file(tensors, str(partial))
    os.chmod(partial, _file_mode())  # safetensors creates it private (0600); shards are not
    partial.replace(path)


def _file_mode() -> int:
    """The mode ``open()`` gives a new file under this process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _shard_samples(sample_bytes: int, batch: int) -> int:
    """Samples per shard: about :data:`SHARD_BYTES`, whole training batches."""
    return max(1, min(10000, SHARD_BYTES // sample_bytes) // batch) * batch


def _samples(
    numbers: range,
    batch: int,
    num_items: int,
    crops: Any,
    item: Any,
    recorder: _Recorder,
    progress: tqdm,
) -> Iterator[tuple[str, bytes]]:
    """``(key, safetensors bytes)`` of the samples ``numbers``, the teachers run on the live
    run's batches: the ``batch`` consecutive places of an epoch's order, each image in its
    row (a batch cut by the shard's edge is run whole)."""
    n = numbers.start
    while n < numbers.stop:
        view, position = divmod(n, num_items)
        first = view * num_items + position // batch * batch
        whole = range(first, min(first + batch, (view + 1) * num_items))
        for m, tensors in zip(whole, recorder(crops(whole)), strict=True):
            if m in numbers:
                index, _ = item(m)
                yield sample_key(index, view), save_safetensors(tensors)
        progress.update(min(whole.stop, numbers.stop) - n)
        n = whole.stop


def _check_existing(manifest: Manifest, out: Path) -> None:
    """Refuse to add to a folder that holds a cache of another run or layout."""
    try:
        existing = Manifest.load(out)
    except FileNotFoundError:
        return
    if existing.content_hash != manifest.content_hash:
        raise ValueError(
            f"{out} holds a cache of another config or views/dtype/layout (manifest hash "
            f"{existing.content_hash}, this run {manifest.content_hash}): choose another --out "
            "or remove that folder"
        )
