"""What a cache's teacher outputs were computed from, recorded when written, re-checked at replay.

A run from a cache does not build its teachers (:class:`~radio_lit.cache.CachedTeacher`), so
what would change their outputs must be recorded by the writer and checked without them:

- **weight files**: every value of a teacher's config that names a local file or folder (a
  SAM checkpoint, a Hugging Face model folder): each file's size, modification time and
  sha256. A replay compares size and mtime (one ``stat`` per file) and hashes a file again
  only when they changed, so a file rewritten with the same bytes still passes;
- **Hub snapshots**: every value that names a Hugging Face repository of the local Hub cache
  (directly, or as a timm model's ``hf_hub_id``): the commit its ref (``main``, or the
  config's ``revision``) points to, so a re-download or a new revision is seen;
- **libraries**: the versions of the packages that compute teacher outputs (a timm or
  open_clip tag can point to other weights after an upgrade; a release can change a forward);
- **precision**: the trainer precision the teachers ran under.

:func:`stale` lists what changed, one line each.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["LIBRARIES", "content", "precision_change", "record", "stale"]

#: Distributions whose versions a cache records (those installed).
LIBRARIES = (
    "torch",
    "torchvision",
    "timm",
    "open_clip_torch",
    "transformers",
    "segment_anything",
    "sam2",
    "safetensors",
    "radio-lit",
)
_CHUNK = 2**24


def _sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_CHUNK):
            hasher.update(block)
    return hasher.hexdigest()


def _file(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(path)}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _weight_files(config: Any) -> dict[str, dict[str, Any]]:
    """Every file named by (or inside a folder named by) a string of ``config``."""
    files: dict[str, dict[str, Any]] = {}
    for text in _strings(config):
        if "\n" in text or len(text) > 4096:
            continue
        path = Path(text).expanduser()
        if path.is_file():
            files[str(path.resolve())] = _file(path)
        elif path.is_dir() and text not in (".", ""):
            for inner in sorted(p for p in path.rglob("*") if p.is_file()):
                files[str(inner.resolve())] = _file(inner)
    return files


def _hub_folder(repo: str) -> Path | None:
    """The local Hub cache folder of model repository ``repo`` (``org/name``), if any."""
    if repo.count("/") != 1 or any(c in repo for c in " :\\") or Path(repo).exists():
        return None
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return None
    folder = Path(HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    return folder if folder.is_dir() else None


def _timm_hub_id(name: str) -> str | None:
    try:
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(name)
    except Exception:  # not a timm name (any string of the config is tried)
        return None
    return getattr(cfg, "hf_hub_id", None) if cfg is not None else None


def _hub_commit(key: str) -> str:
    """What the recorded ``repo@ref`` points to now in the local Hub cache."""
    repo, ref = key.rsplit("@", 1)
    folder = _hub_folder(repo)
    path = folder / "refs" / ref if folder is not None else None
    return path.read_text().strip() if path is not None and path.is_file() else "nothing"


def _hub_commits(config: Any) -> dict[str, str]:
    """``repo@ref -> commit`` for every Hub repository of the local cache named by ``config``."""
    revision = config.get("revision") if isinstance(config, Mapping) else None
    ref = revision if isinstance(revision, str) else "main"
    commits = {}
    for text in _strings(config):
        for repo in (text, _timm_hub_id(text) if "." in text or "_" in text else None):
            folder = _hub_folder(repo) if repo else None
            if folder is None:
                continue
            commits[f"{repo}@{ref}"] = _hub_commit(f"{repo}@{ref}")
    return commits


def libraries() -> dict[str, str]:
    """Installed versions of :data:`LIBRARIES`."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def record(teacher_configs: Mapping[str, Any], precision: str) -> dict[str, Any]:
    """The identity of a cache's teachers (see the module docstring), JSON-ready."""
    return {
        "files": {name: _weight_files(config) for name, config in teacher_configs.items()},
        "hub": {name: _hub_commits(config) for name, config in teacher_configs.items()},
        "libraries": libraries(),
        "precision": precision,
    }


def content(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an identity the cached bytes depend on (not the files' mtimes)."""
    files = {
        name: {path: {"size": f["size"], "sha256": f["sha256"]} for path, f in entries.items()}
        for name, entries in identity.get("files", {}).items()
    }
    return {**identity, "files": files}


def stale(identity: Mapping[str, Any]) -> list[str]:
    """What changed since the cache was written, one line each (empty: nothing): weight
    files, Hub commits, library versions (:func:`precision_change` compares the precision)."""
    changes = []
    for name, entries in identity.get("files", {}).items():
        for path, recorded in entries.items():
            file = Path(path)
            if not file.is_file():
                changes.append(f"teacher {name}'s weight file {path} is gone")
                continue
            stat = file.stat()
            if stat.st_size == recorded["size"] and stat.st_mtime_ns == recorded["mtime_ns"]:
                continue
            digest = _sha256(file)
            if digest != recorded["sha256"]:
                changes.append(
                    f"teacher {name}'s weight file {path} changed since the cache was written "
                    f"(sha256 {recorded['sha256'][:12]} in the cache, {digest[:12]} now)"
                )
    for name, commits in identity.get("hub", {}).items():
        for key, commit in commits.items():
            now = _hub_commit(key)
            if now != commit:
                changes.append(
                    f"teacher {name}'s Hub repository {key} points to {now}, the cache was "
                    f"written from {commit}"
                )
    installed = libraries()
    for library, version in identity.get("libraries", {}).items():
        if installed.get(library) != version:
            now = installed.get(library, "not installed")
            changes.append(f"{library} {version} wrote the cache, {now} is installed")
    return changes


def precision_change(identity: Mapping[str, Any], precision: str) -> list[str]:
    """The line saying the teachers ran under another precision than ``precision`` (the
    replaying run's trainer precision) for the cache, if they did."""
    recorded = identity.get("precision")
    if recorded is None or recorded == precision:
        return []
    return [f"the teachers ran under precision {recorded} for the cache, this run uses {precision}"]
