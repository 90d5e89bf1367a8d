"""The manifest of a teacher-feature cache: what was cached, and whether a run may use it.

``DIR/manifest.json`` records the teachers (their config and a signature of what their outputs
depend on: class, resolution, patch size, pixel mean/std, grid, widths, a sha256 of the
weights' bytes; whether a mosaic mixes a view with its neighbours), the view sizes each
teacher was run at, the data source, the number of views per image, the storage dtype and
layout, the grouping the outputs were computed in (rank counts, per-rank batch, partitions:
:mod:`radio_lit.cache.grouping`), what they were computed from (weight files, Hub commits,
library versions, precision: :mod:`radio_lit.cache.identity`), and a hash of all of it. A run
that reads the cache (:class:`~radio_lit.cache.CachedViews`) is checked against it first
(:func:`check_run`): a missing teacher, another teacher, or a student resolution whose
teacher views were not cached is refused with one line naming the difference.

Samples are numbered ``n = view * num_items + p``, ``p`` the item's position in the one-rank
training order of epoch ``view`` (:func:`epoch_order`; all views 0 first), and shard ``j``
holds samples ``[j K, (j + 1) K)``, ``K = samples_per_shard``: consecutive samples are the
live run's batches at one rank, and a ``max_steps`` run's cache holds only its first
``samples`` (:attr:`Manifest.samples`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from radio_lit.cache.identity import content as identity_content
from radio_lit.data.resumable import SeededSampler
from radio_lit.teachers import Teacher
from radio_lit.training.partitions import PartitionPlan

__all__ = [
    "MANIFEST",
    "DTYPES",
    "Manifest",
    "check_run",
    "epoch_order",
    "teacher_signature",
    "view_sizes",
]

#: File name of the manifest inside a cache folder.
MANIFEST = "manifest.json"
#: Storage dtypes of the teacher outputs, by name.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
#: Version of the storage layout described in this module (3: outputs per rank count,
#: per-sample checksums, content identities).
FORMAT = 3
#: File of the validation views (all of them, in ``val_dir`` order), beside the shards.
VAL_FILE = "val.safetensors"


def epoch_order(num_items: int, seed: int, epoch: int) -> list[int]:
    """The item indices in the order a one-rank run of data seed ``seed`` visits them in
    epoch ``epoch`` (:class:`~radio_lit.data.resumable.SeededSampler`)."""
    sampler = SeededSampler(range(num_items), num_replicas=1, rank=0, seed=seed)
    sampler.set_epoch(epoch)
    return [index for index, _ in sampler]


def weights_digest(module: nn.Module) -> str:
    """sha256 (16 hex digits) of a module's parameters and buffers: names, shapes, dtypes and
    every byte, so permuted or slightly changed weights differ; the same on any device."""
    hasher = hashlib.sha256()
    tensors = [*module.named_parameters(), *module.named_buffers()]
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        hasher.update(f"{name}:{list(tensor.shape)}:{tensor.dtype};".encode())
        hasher.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return hasher.hexdigest()[:16]


def teacher_signature(teacher: Teacher) -> dict[str, Any]:
    """What a teacher's outputs depend on, beside the crop and the view size, and how the
    step treats them (``interpolatable``); a teacher read from a cache
    (:class:`~radio_lit.cache.CachedTeacher`) has the signature recorded there."""
    if not teacher.live:
        return dict(teacher.signature)  # type: ignore[attr-defined]
    return {
        "class": f"{type(teacher).__module__}.{type(teacher).__qualname__}",
        "resolution": teacher.resolution,
        "patch_size": teacher.patch_size,
        "mean": list(teacher.mean),
        "std": list(teacher.std),
        "follow_student": teacher.follow_student,
        "feature_dim": teacher.feature_dim,
        "summary_dim": teacher.summary_dim,
        "interpolatable": teacher.interpolatable,
        "weights": weights_digest(teacher),
    }


def view_sizes(
    teachers: Mapping[str, Teacher], plan: PartitionPlan, patch_size: int
) -> dict[str, list[tuple[int, int]]]:
    """Per teacher, every view size ``(H, W)`` it can see in this run: its native
    resolution, or one per student resolution of its partitions if it follows the student."""
    sizes: dict[str, list[tuple[int, int]]] = {name: [] for name in teachers}
    for partition, members in plan.members.items():
        for height, width in plan.resolutions[partition]:
            grid = (height // patch_size, width // patch_size)
            for name in members:
                size = teachers[name].view_size(grid)
                if size not in sizes[name]:
                    sizes[name].append(size)
    return sizes


@dataclass
class Manifest:
    """The JSON manifest of a cache folder (see the module docstring).

    Attributes:
        teachers: name -> ``{"config", "signature", "sizes", "shapes"}``; ``shapes`` maps each
            stored key (:func:`radio_lit.training.batch.output_key`) to its per-view shape.
        data: ``{"config": the run's data section, "crop_size", "view_margin", "seed", "num_items",
            "batch_size", "val_dir", "val_items"}``; ``val_items`` validation views (the
            center crops of ``val_dir``) are in :data:`VAL_FILE`.
        views: views cached per image.
        dtype: storage dtype of the teacher outputs (a key of :data:`DTYPES`).
        samples_per_shard: samples per tar shard (the last shard may hold fewer).
        sample_bytes: bytes of one sample inside a shard (all samples have the same size).
        bytes_per_view: bytes per view: ``"pixels"`` and each teacher's outputs.
        created_by: the command that wrote the cache.
        grouping: ``{"ranks", "batch_size", "partitions"}``: the rank counts whose teacher
            batches and mosaic canvases the outputs were computed in (stored once per rank
            count, :mod:`radio_lit.cache.grouping`), the per-rank batch and the partitions.
        identity: what the outputs were computed from (weight files, Hub commits, library
            versions, precision; :mod:`radio_lit.cache.identity`).
        samples: the first samples only were written (what a ``max_steps`` run reads);
            ``None``: every view of every item.
    """

    teachers: dict[str, dict[str, Any]]
    data: dict[str, Any]
    views: int
    dtype: str
    samples_per_shard: int
    sample_bytes: int = 0
    bytes_per_view: dict[str, int] = field(default_factory=dict)
    created_by: str = ""
    grouping: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)
    samples: int | None = None
    format: int = FORMAT

    @property
    def num_items(self) -> int:
        """Training items (images, times the data's repeats) per view."""
        return int(self.data["num_items"])

    @property
    def val_items(self) -> int:
        """Validation views in :data:`VAL_FILE` (0: the cache has none)."""
        return int(self.data.get("val_items", 0))

    @property
    def num_samples(self) -> int:
        return self.views * self.num_items if self.samples is None else self.samples

    @property
    def ranks(self) -> list[int]:
        """The rank counts the outputs were computed for."""
        return [int(r) for r in self.grouping.get("ranks", [1])]

    @property
    def mosaic_teachers(self) -> list[str]:
        """Teachers whose outputs depend on their canvas neighbours (mosaics)."""
        return [name for name, record in self.teachers.items() if record.get("mosaic")]

    @property
    def num_shards(self) -> int:
        return -(-self.num_samples // self.samples_per_shard)

    def shard_samples(self, shard: int) -> range:
        """The sample numbers shard ``shard`` holds."""
        start = shard * self.samples_per_shard
        return range(start, min(start + self.samples_per_shard, self.num_samples))

    @property
    def content_hash(self) -> str:
        """sha256 (16 hex digits) of everything the cached bytes depend on."""
        keys = ("teachers", "views", "dtype", "samples_per_shard", "format", "grouping")
        content = {key: getattr(self, key) for key in keys}
        content["data"] = views_config(self.data)
        content["identity"] = identity_content(self.identity)
        content["samples"] = self.num_samples
        text = json.dumps(content, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def save(self, folder: Path) -> None:
        record = {**asdict(self), "hash": self.content_hash}
        path = folder / MANIFEST
        partial = path.with_suffix(f".json.{os.getpid()}.partial")  # writers may run at once
        partial.write_text(json.dumps(record, indent=2, default=str) + "\n")
        partial.replace(path)

    @classmethod
    def load(cls, folder: str | Path) -> Manifest:
        """Read ``folder/manifest.json``; one clear error if it is missing or unreadable."""
        path = Path(folder) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} is not a radio-lit cache (no {MANIFEST}): write one with "
                f"radio-lit cache --config RUN.yaml --out {folder}"
            )
        try:
            record = json.loads(path.read_text())
            record.pop("hash", None)
            manifest = cls(**record)
        except (json.JSONDecodeError, TypeError) as error:
            raise ValueError(f"{path} is not a readable cache manifest ({error})") from error
        if manifest.format != FORMAT:
            raise ValueError(
                f"{path} has cache format {manifest.format}, this radio_lit reads {FORMAT}: "
                "write the cache again with radio-lit cache"
            )
        return manifest


def views_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a manifest's data record that the views depend on (not the batch size
    or the workers)."""
    unused = ("batch_size", "num_workers")
    config = json.loads(json.dumps(data.get("config", {}), default=str))
    init = config.get("init_args", {})
    for key in unused:
        init.pop(key, None)
    kept = {k: v for k, v in data.items() if k != "config" and k not in unused}
    return {**kept, "config": config}


def _sizes_text(sizes: Sequence[Sequence[int]]) -> str:
    return ", ".join(f"{h}x{w}" for h, w in sizes)


def check_run(
    manifest: Manifest,
    folder: str | Path,
    teachers: Mapping[str, Teacher],
    plan: PartitionPlan,
    patch_size: int,
    margin: float = 0.0,
) -> None:
    """Refuse, with one line naming the first difference, a run the cache cannot feed.

    The run's teachers must be the cache's (same names, same signature), every view size
    the run can draw (:func:`view_sizes`) must be cached, and the training views must show the
    same region of the crop (``model.shifts``' ``margin``). Normalizers, losses, balancers, the
    grid policy and the student may differ: they come after the teachers.
    """
    fix = "write a cache for this run with radio-lit cache --config RUN.yaml --out NEW_DIR"
    cached_margin = float(manifest.data.get("view_margin", 0.0))
    if cached_margin != margin:
        raise ValueError(
            f"the cache {folder} holds teacher views of the crop less a {cached_margin} margin, "
            f"this run views it less a {margin} margin (model.shifts.init_args.margin): {fix}"
        )
    missing = [name for name in teachers if name not in manifest.teachers]
    if missing:
        raise ValueError(
            f"the cache {folder} has no teacher {missing[0]} (it holds "
            f"{', '.join(manifest.teachers)}): {fix}"
        )
    for name, teacher in teachers.items():
        cached = manifest.teachers[name]["signature"]
        run = json.loads(json.dumps(teacher_signature(teacher)))
        for key, value in run.items():
            if cached.get(key) != value:
                what = "weights digest" if key == "weights" else key
                raise ValueError(
                    f"teacher {name} differs from the cache {folder}: {what} "
                    f"{cached.get(key)} in the cache, {value} in this run: {fix}"
                )
    needed = view_sizes(teachers, plan, patch_size)
    for name, sizes in needed.items():
        held = [tuple(size) for size in manifest.teachers[name]["sizes"]]
        absent = [size for size in sizes if size not in held]
        if absent:
            raise ValueError(
                f"this run shows teacher {name} views of {_sizes_text(absent)} pixels (its "
                f"student resolutions); the cache {folder} holds {_sizes_text(held)}: {fix}"
            )
