"""Run a config's teachers once over its training data and store the views (``radio-lit cache``,
:mod:`radio_lit.cli.cache`).

For every training item ``i`` (images, times the data's ``repeats``) and view ``v < views``
the writer draws the crop exactly as training draws item ``i`` in epoch ``v`` (the same
transform under the seed ``(seed, v, i)``, :mod:`radio_lit.data.resumable`), and runs every
teacher on it at every view size the run can show it (its native resolution, or one per
student resolution of its partitions if it follows the student), with the step's own code
(:func:`~radio_lit.training.teachers.run_teachers`), on the very rows the live step gives the
teacher in epoch ``v`` at each rank count of ``--ranks`` (same images, same rows, same mosaic
canvases:
:mod:`radio_lit.cache.grouping`; the rows no partition of a teacher takes are then run through
it together). Stored per view: the crop (uint8, what the student's view is made from) and each
teacher's summary and features on its own grid, before normalization, in ``--dtype``, once
per rank count. The validation images of
the run's ``val_dir`` (their fixed center crops, in each rank's validation batches) are stored
the same way, in one file, so a run from the cache validates without its teachers. Layout:
:mod:`radio_lit.cache.shards`, :mod:`radio_lit.cache.manifest`.

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
from collections.abc import Iterator, Mapping, Sequence
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

from radio_lit.cache import identity
from radio_lit.cache.grouping import (
    grouped_key,
    partitions_record,
    train_places,
    train_steps,
    val_places,
)
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
from radio_lit.training.batch import output_key
from radio_lit.training.teachers import run_teachers

__all__ = ["write_cache"]

#: Target size of one shard when --samples-per-shard is not given.
SHARD_BYTES = 256 * 2**20
#: Tar bytes beside the samples: the end-of-archive blocks and the record padding.
_TAR_END = 10240


def _device(device: str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


class _Recorder:
    """Runs the teachers on uint8 crops as the step does (see the module docstring).

    Each partition's teachers run on the rows of the batch the partition takes, all at once,
    as in a live step: a mosaic teacher's canvases, and the rounding of some CPU kernels,
    depend on a view's neighbours in that batch (:mod:`radio_lit.cache.grouping`).
    """

    def __init__(self, module: Any, device: torch.device, precision: str) -> None:
        self.teachers = module.teachers.to(device)
        self.plan = module.partitions
        self.patch = module.student.patch_size
        self.margin = module.student_step.margin  # training views: the crop's shared region
        self.device = device
        half = {"bf16": torch.bfloat16, "16": torch.float16}
        autocast = next((d for p, d in half.items() if precision.startswith(p)), None)
        self.autocast = (
            torch.autocast(device.type, dtype=autocast)
            if autocast is not None and device.type == "cuda"
            else nullcontext()
        )

    def __call__(
        self, pixels: Tensor, rows: Mapping[str, slice], train: bool = True
    ) -> dict[str, Tensor]:
        """Outputs ``{output_key: [B, ...] float32}`` of each partition's teachers on its
        ``rows`` of the crops ``pixels [B, 3, S, S]`` uint8 (all at once, as the step runs
        them), at every student resolution of the partition; ``train``: of the crop's shared
        region (``model.shifts``' margin, :mod:`radio_lit.geometry.shifts`), else of the whole crop.

        The rows no partition of a teacher takes here are then run through it together
        [choice]: a replay in another grouping reads them, which the cache allows only
        without mosaics (equal up to rounding, :func:`~radio_lit.cache.grouping.grouping_problem`).
        """
        crop = as_float_images(pixels.to(self.device))
        margin = self.margin if train else 0.0
        stored: dict[str, Tensor] = {}
        filled: dict[str, Tensor] = {}  # features key -> rows holding the teacher's outputs
        with torch.no_grad(), self.autocast:
            for partition, taken in rows.items():
                index = torch.arange(len(pixels))[taken]
                for grid in self._grids(partition):
                    names = [
                        n
                        for n in self.plan.members[partition]
                        if not self._filled(filled, n, grid, index, len(pixels)).any()
                    ]
                    self._run(crop, index, names, grid, stored, filled, margin)
            for partition in self.plan.partitions:
                for grid in self._grids(partition):
                    for name in self.plan.members[partition]:
                        rest = (~self._filled(filled, name, grid, None, len(pixels))).nonzero()
                        self._run(crop, rest[:, 0], [name], grid, stored, filled, margin)
        return stored

    def _grids(self, partition: str) -> list[tuple[int, int]]:
        return [(h // self.patch, w // self.patch) for h, w in self.plan.resolutions[partition]]

    def _filled(
        self,
        filled: dict[str, Tensor],
        name: str,
        grid: tuple[int, int],
        index: Tensor | None,
        count: int,
    ) -> Tensor:
        """Which rows (of ``index``, default all) hold teacher ``name``'s outputs at ``grid``."""
        key = output_key(name, self.teachers[name].view_size(grid), "features")
        done = filled.get(key, torch.zeros(count, dtype=torch.bool))
        return done if index is None else done[index]

    def _run(
        self,
        crop: Tensor,
        index: Tensor,
        names: list[str],
        grid: tuple[int, int],
        stored: dict[str, Tensor],
        filled: dict[str, Tensor],
        margin: float,
    ) -> None:
        """Teachers ``names`` on the rows ``index`` of ``crop`` at once, into ``stored``."""
        if not names or not len(index):
            return
        for name, out in run_teachers(
            self.teachers, crop[index], names, grid, margin=margin
        ).items():
            size = self.teachers[name].view_size(grid)
            for part, value in (("features", out.features), ("summary", out.summary)):
                if value is None:
                    continue
                key = output_key(name, size, part)
                if key not in stored:
                    stored[key] = torch.full((len(crop), *value.shape[1:]), torch.nan)
                stored[key][index] = value.float().cpu()
            key = output_key(name, size, "features")
            filled.setdefault(key, torch.zeros(len(crop), dtype=torch.bool))[index] = True

    def rank_rows(self, ranks: int, rank: int, batch: int) -> dict[str, slice]:
        """The rows of a training batch that rank ``rank`` of ``ranks`` gives each partition."""
        placement = self.plan.placement
        try:
            self.plan.place(ranks, rank)
            return self.plan.rows(batch)
        finally:
            self.plan.placement = placement

    def all_rows(self) -> dict[str, slice]:
        """Validation: every partition on the whole batch."""
        return {name: slice(None) for name in self.plan.partitions}


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
    ranks: Sequence[int] = (1,),
    samples: int | None = None,
) -> Manifest:
    """Write this process's shards of the cache of a run (``module``: its
    :class:`~radio_lit.module.DistillationModule`, ``datamodule`` its image datamodule,
    ``config`` its parsed config as a dict) for replays at ``ranks`` ranks; ``samples``: the
    first samples only (default: every view of every item); returns the manifest."""
    dataset = datamodule.build_train_dataset()
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ValueError(
            f"radio-lit cache reads map-style training data (data: ImageFolderDataModule or "
            f"SyntheticDataModule), not {type(datamodule).__name__}'s streamed shards"
        )
    seed = datamodule.seed
    batch = datamodule.batch_size
    ranks = sorted(set(ranks))
    recorder = _Recorder(module, _device(device), precision)
    num_items = len(dataset)
    for world in ranks:
        train_places(num_items, world, batch, 0)  # refuses a grouping a cache cannot hold
        for rank in range(world):
            recorder.rank_rows(world, rank, batch)  # refuses a batch the partitions overflow

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

    val_images = _val_images(datamodule)
    probe = {key: value[0] for key, value in recorder(crops([0]), {}).items()}
    storage = DTYPES[dtype]
    one = {"pixels": crops([0])[0], **{k: v.to(storage) for k, v in probe.items()}}
    sample_bytes = _tar_bytes(
        save_safetensors(
            {"pixels": one["pixels"]}
            | {grouped_key(k, w): v.clone() for w in ranks for k, v in one.items() if k != "pixels"}
        )
    )
    sizes = view_sizes(module.teachers, module.partitions, module.student.patch_size)
    teachers_config = config["model"]["teachers"]
    mine_keys = {name: [k for k in one if k.startswith(f"{name}/")] for name in module.teachers}
    manifest = Manifest(
        teachers={
            name: {
                "config": teachers_config.get(name),
                "signature": teacher_signature(teacher),
                "sizes": [list(size) for size in sizes[name]],
                "shapes": {k: list(one[k].shape) for k in mine_keys[name]},
                "mosaic": any(teacher.shares_canvas(tuple(size)) for size in sizes[name]),
            }
            for name, teacher in module.teachers.items()
        },
        data={
            "config": config["data"],
            "crop_size": datamodule.crop_size,
            "view_margin": module.student_step.margin,
            "seed": seed,
            "num_items": num_items,
            "batch_size": datamodule.batch_size,
            "val_dir": datamodule.val_dir,
            "val_items": len(val_images),
        },
        views=views,
        dtype=dtype,
        samples_per_shard=samples_per_shard or _shard_samples(sample_bytes, batch),
        sample_bytes=sample_bytes,
        bytes_per_view={
            "pixels": one["pixels"].nbytes,
            **{
                name: len(ranks) * sum(one[k].nbytes for k in mine_keys[name])
                for name in module.teachers
            },
        },
        created_by=command,
        grouping={
            "ranks": ranks,
            "batch_size": batch,
            "partitions": partitions_record(module.partitions),
        },
        identity=identity.record(
            {name: teachers_config.get(name) for name in module.teachers}, precision
        ),
        samples=samples if samples is not None and samples < views * num_items else None,
    )
    out.mkdir(parents=True, exist_ok=True)
    _check_existing(manifest, out)
    manifest.save(out)

    mine = [j for j in range(manifest.num_shards) if j % num_shards == shard_index]
    todo = [j for j in mine if not shard_is_complete(out, j, len(manifest.shard_samples(j)))]
    count = sum(len(manifest.shard_samples(j)) for j in todo)
    need = count * sample_bytes + len(todo) * _TAR_END
    val_path = out / VAL_FILE
    val_view = one["pixels"].nbytes + len(ranks) * sum(v.numel() * 4 for v in probe.values())
    val_bytes = manifest.val_items * val_view  # float32
    if shard_index == 0 and not val_path.is_file():
        need += val_bytes
    total = manifest.num_samples * sample_bytes + manifest.num_shards * _TAR_END + val_bytes
    per_teacher = ", ".join(f"{k} {_human(v)}" for k, v in manifest.bytes_per_view.items())
    print(
        f"radio-lit cache: {num_items} items x {views} views = {views * num_items} views, "
        f"{'all' if manifest.samples is None else 'the run reads the first'} "
        f"{manifest.num_samples} ({dtype}, for {' and '.join(map(str, ranks))} rank(s)); "
        f"per view: {per_teacher}; "
        f"total {_human(total)} in {manifest.num_shards} shard(s); this process: {len(todo)} "
        f"of its {len(mine)} shard(s) left, {_human(need)}",
        flush=True,
    )
    free = shutil.disk_usage(out).free
    if need > free:
        raise OSError(
            f"{out} needs {_human(need)} for the cache but its disk has {_human(free)} free: "
            "free some space or choose another --out (finished shards are kept)"
        )
    if shard_index == 0 and len(val_images) and not val_path.is_file():
        _write_val(val_path, val_images, recorder, ranks, batch)
    steps = _Steps(recorder, crops, num_items, batch, ranks)
    with tqdm(total=count, unit="view", desc="radio-lit cache", file=sys.stderr) as progress:
        for shard in todo:
            numbers = manifest.shard_samples(shard)
            write_shard(out, shard, _samples(numbers, steps, item, storage, progress))
    return manifest


def _val_images(datamodule: Any) -> Tensor:
    """The validation crops ``[N, 3, S, S]`` uint8 in ``val_dir`` order (none without it)."""
    if datamodule.val_dir is None:
        return torch.zeros(0, dtype=torch.uint8)
    datamodule.setup("validate")
    return torch.cat(list(datamodule.val_dataloader()))


def _write_val(
    path: Path, images: Tensor, recorder: _Recorder, ranks: Sequence[int], batch: int
) -> None:
    """The validation views: at each rank count, every teacher on each rank's validation
    batches as the validation step runs them (:func:`~radio_lit.cache.grouping.val_places`),
    stacked into one safetensors file; in float32 whatever the cache's dtype, so validation
    measures against the teachers' own numbers. An image a rank validates twice (the padding
    of the last batches) keeps its first batch's outputs."""
    tensors: dict[str, Tensor] = {"pixels": images}
    for world in ranks:
        filled = torch.zeros(len(images), dtype=torch.bool)
        for rank_batches in val_places(len(images), world, batch):
            for indices in rank_batches:
                outputs = recorder(images[indices], recorder.all_rows(), train=False)
                new = [row for row, index in enumerate(indices) if not filled[index]]
                for key, value in outputs.items():
                    blank = torch.full((len(images), *value.shape[1:]), torch.nan)
                    stored = tensors.setdefault(grouped_key(key, world), blank)
                    stored[[indices[row] for row in new]] = value[new]
                filled[indices] = True
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


class _Steps:
    """The live run's training steps at each rank count, one at a time: per place of the
    step's batches (all ranks), the crop and every teacher's outputs. The places after the
    last full batch (``drop_last``) are run as one batch of their own."""

    def __init__(
        self, recorder: _Recorder, crops: Any, num_items: int, batch: int, ranks: Sequence[int]
    ) -> None:
        self.recorder, self.crops, self.num_items, self.batch = recorder, crops, num_items, batch
        self.ranks = ranks
        self._last: dict[int, tuple[tuple[int, int], dict[int, dict[str, Tensor]]]] = {}

    def outputs(self, view: int, place: int, world: int) -> dict[str, Tensor]:
        """The crop (``"pixels"``) and every teacher's outputs for the item at ``place`` of
        epoch ``view`` at ``world`` ranks."""
        steps = train_steps(self.num_items, world, self.batch)
        step = min(place // (self.batch * world), steps)
        if self._last.get(world, ((-1, -1),))[0] != (view, step):
            self._last[world] = ((view, step), self._step(view, step, world))
        return self._last[world][1][place]

    def _step(self, view: int, step: int, world: int) -> dict[int, dict[str, Tensor]]:
        if step == train_steps(self.num_items, world, self.batch):  # the dropped places
            batches = [(list(range(step * self.batch * world, self.num_items)), {})]
        else:
            batches = [
                (places, self.recorder.rank_rows(world, rank, self.batch))
                for rank, places in enumerate(train_places(self.num_items, world, self.batch, step))
            ]
        by_place = {}
        for places, rows in batches:
            pixels = self.crops([view * self.num_items + p for p in places])
            outputs = self.recorder(pixels, rows)
            for row, place in enumerate(places):
                by_place[place] = {"pixels": pixels[row]} | {
                    key: value[row] for key, value in outputs.items()
                }
        return by_place


def _samples(
    numbers: range, steps: _Steps, item: Any, storage: torch.dtype, progress: tqdm
) -> Iterator[tuple[str, bytes]]:
    """``(key, safetensors bytes)`` of the samples ``numbers``: the crop, and each teacher's
    outputs at each rank count, computed on the live run's batches (a step cut by the
    shard's edge is run whole)."""
    for n in numbers:
        index, view = item(n)
        place = n - view * steps.num_items
        tensors: dict[str, Tensor] = {}
        for world in steps.ranks:
            outputs = dict(steps.outputs(view, place, world))
            tensors["pixels"] = outputs.pop("pixels")
            for key, value in outputs.items():
                tensors[grouped_key(key, world)] = value.to(storage).clone()  # no shared memory
        yield sample_key(index, view), save_safetensors(tensors)
        progress.update(1)


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
