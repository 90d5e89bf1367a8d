"""The teachers of a run from a cache: their shape from the manifest, no weights.

A run whose data is :class:`~radio_lit.cache.CachedViews` does not build its teachers: the
``radio-lit`` command checks each configured teacher against the one the cache was written
with (:func:`check_teacher_configs`) and puts a :class:`CachedTeacher` in its place, which
has everything the step and the heads read of a teacher (resolution, patch size, pixel
statistics, grid, widths, whether its features may be resampled) and no weights. Its outputs
come from the batches (:class:`~radio_lit.cache.CachedBatch`), for training and validation
alike; measures that compare with a live teacher (PCA images, mode switching, zero-shot) see
none in such a run, as for an exported model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from radio_lit.cache.manifest import Manifest
from radio_lit.teachers import Teacher, TeacherOutput

__all__ = ["CachedTeacher", "cached_teacher_configs", "check_teacher_configs"]


class CachedTeacher(Teacher):
    """Teacher ``name`` of the cache in ``path``, as the manifest records it (no weights).

    Args:
        path: the cache folder (``radio-lit cache --out``).
        name: the teacher's name in the cache.
    """

    live = False

    def __init__(self, path: str, name: str) -> None:
        manifest = Manifest.load(path)
        if name not in manifest.teachers:
            raise ValueError(
                f"the cache {path} has no teacher {name} (it holds {', '.join(manifest.teachers)})"
            )
        signature = dict(manifest.teachers[name]["signature"])
        super().__init__(
            resolution=int(signature["resolution"]),
            patch_size=int(signature["patch_size"]),
            mean=tuple(signature["mean"]),  # type: ignore[arg-type]
            std=tuple(signature["std"]),  # type: ignore[arg-type]
            follow_student=bool(signature["follow_student"]),
        )
        self.path, self.name, self.signature = str(path), name, signature
        self.interpolatable = bool(signature["interpolatable"])  # type: ignore[misc]
        self.has_summary = signature["summary_dim"] is not None

    @property
    def feature_dim(self) -> int:
        return int(self.signature["feature_dim"])

    @property
    def summary_dim(self) -> int | None:
        dim = self.signature["summary_dim"]
        return None if dim is None else int(dim)

    def encode(self, view: Tensor) -> TeacherOutput:
        raise RuntimeError(
            f"teacher {self.name} ({self.signature['class']}) is read from the cache "
            f"{self.path} in this run and was not built: only the cached views have its "
            "outputs; evaluate with the live teachers after training (radio-lit evaluate "
            "CHECKPOINT)"
        )


def _difference(cached: Any, run: Any, path: str = "") -> str | None:
    """The first key path where two parsed configs differ, with both values."""
    if isinstance(cached, Mapping) and isinstance(run, Mapping):
        for key in [*cached, *(k for k in run if k not in cached)]:
            found = _difference(cached.get(key), run.get(key), f"{path}.{key}".lstrip("."))
            if found is not None:
                return found
        return None
    if cached != run:
        return f"{path} {json.dumps(cached)} in the cache, {json.dumps(run)} in this run"
    return None


def check_teacher_configs(
    manifest: Manifest, folder: str | Path, teachers: Mapping[str, Any]
) -> None:
    """Refuse, with one line naming the first difference, teachers (``model.teachers`` of a
    parsed config) that are not those the cache was written with."""
    fix = "write a cache for this run with radio-lit cache --config RUN.yaml --out NEW_DIR"
    for name, config in teachers.items():
        if name not in manifest.teachers:
            raise ValueError(
                f"the cache {folder} has no teacher {name} (it holds "
                f"{', '.join(manifest.teachers)}): {fix}"
            )
        cached = json.loads(json.dumps(manifest.teachers[name]["config"], default=str))
        found = _difference(cached, json.loads(json.dumps(config, default=str)))
        if found is not None:
            raise ValueError(f"teacher {name} differs from the cache {folder}: {found}: {fix}")


def cached_teacher_configs(folder: str, teachers: Mapping[str, Any]) -> dict[str, Any]:
    """``model.teachers`` of a run from the cache in ``folder``: each configured teacher,
    checked against the cache (:func:`check_teacher_configs`), replaced by its
    :class:`CachedTeacher`."""
    check_teacher_configs(Manifest.load(folder), folder, teachers)
    return {
        name: {
            "class_path": f"{__name__}.CachedTeacher",
            "init_args": {"path": folder, "name": name},
        }
        for name in teachers
    }
