"""Tar shards of cached views: webdataset layout, safetensors payloads, random access.

Shard ``j`` of a cache folder is ``shard-<j>.tar``, a webdataset shard (one member
``<key>.safetensors`` per sample, key ``i<index>_v<view>``; no pickle anywhere) that any
webdataset reader can stream. Beside it, ``shard-<j>.json`` lists each sample's member name,
byte offset, size and CRC-32 in the tar and the tar's total size, so a sample is read with one
seek (map-style, for the shuffled and resumable training order), a missing or truncated shard
is found before training starts, and a damaged sample (bytes overwritten in place) or a
sample under another key is refused when read (:class:`DamagedShard`, one line naming the
shard and the fix; a CRC-32 costs about a memory copy of the sample).

A shard is written to ``shard-<j>.tar.partial`` and renamed when complete, after its index:
an interrupted writer leaves only finished shards under their final names, and the next run
rewrites the partial one (into the same bytes: shards are reproducible).
"""

from __future__ import annotations

import json
import tarfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import load as load_safetensors
from torch import Tensor
from webdataset import TarWriter

from radio_lit.core.errors import ConfigError

__all__ = [
    "TAR_OPTIONS",
    "DamagedShard",
    "ShardReader",
    "shard_is_complete",
    "shard_path",
    "write_shard",
]

#: ``webdataset.TarWriter`` options: payloads are bytes already; a fixed member time makes a
#: shard's bytes depend on its samples only (a rewritten shard is the same file).
TAR_OPTIONS = {"encoder": False, "mtime": 0.0}


def shard_path(folder: Path, shard: int) -> Path:
    return folder / f"shard-{shard:06d}.tar"


def _index_path(folder: Path, shard: int) -> Path:
    return folder / f"shard-{shard:06d}.json"


def sample_key(index: int, view: int) -> str:
    return f"i{index:09d}_v{view:04d}"


class DamagedShard(ConfigError):
    """A cache sample whose bytes or key are not those written (one line, exit code 2).

    Raised in a DataLoader worker, it reaches the main process re-created from a message
    that carries the worker's traceback; only the last line, the original message, is kept.
    """

    def __init__(self, message: str) -> None:
        if message.startswith("Caught "):
            lines = [line for line in message.splitlines() if line.strip()]
            message = lines[-1].split(f"{type(self).__name__}: ", 1)[-1]
        super().__init__(message)


def member_name(key: str) -> str:
    return f"{key}.safetensors"


def write_shard(folder: Path, shard: int, samples: Iterable[tuple[str, bytes]]) -> None:
    """Write shard ``shard`` from ``(key, safetensors bytes)`` pairs, then its index, then
    rename it into place (see the module docstring)."""
    final = shard_path(folder, shard)
    partial = final.with_name(final.name + ".partial")
    checksums = []
    with TarWriter(str(partial), **TAR_OPTIONS) as writer:
        for key, payload in samples:
            writer.write({"__key__": key, "safetensors": payload})
            checksums.append(zlib.crc32(payload))
    with tarfile.open(partial) as tar:
        members = [
            (m.name, m.offset_data, m.size, crc)
            for m, crc in zip(tar.getmembers(), checksums, strict=True)
        ]
    index = {"bytes": partial.stat().st_size, "samples": members}
    index_partial = _index_path(folder, shard).with_suffix(".json.partial")
    index_partial.write_text(json.dumps(index))
    index_partial.replace(_index_path(folder, shard))
    partial.replace(final)


def shard_problem(folder: Path, shard: int, expected: int) -> str | None:
    """Why shard ``shard`` (``expected`` samples) cannot be read, or ``None`` if it can."""
    path = shard_path(folder, shard)
    if not path.is_file():
        return f"cache shard {path} is missing"
    try:
        index = json.loads(_index_path(folder, shard).read_text())
    except (OSError, json.JSONDecodeError):
        return f"cache shard {path} has no readable index {_index_path(folder, shard).name}"
    size = path.stat().st_size
    if size != index["bytes"] or len(index["samples"]) != expected:
        return (
            f"cache shard {path} is truncated ({size} of {index['bytes']} bytes, "
            f"{len(index['samples'])} of {expected} samples)"
        )
    return None


def shard_is_complete(folder: Path, shard: int, expected: int) -> bool:
    return shard_problem(folder, shard, expected) is None


class ShardReader:
    """Random access to the samples of a cache folder's shards.

    Args:
        folder: the cache folder.
        shards: per shard, the number of samples it must hold.

    Raises ``FileNotFoundError`` naming the first missing or truncated shard. File handles are
    opened per process on first use (the reader can be sent to DataLoader workers).
    """

    def __init__(self, folder: Path, shards: list[int], fix: str) -> None:
        self.folder = folder
        self.index: list[list[tuple[int, int]]] = []
        for shard, expected in enumerate(shards):
            problem = shard_problem(folder, shard, expected)
            if problem is not None:
                raise FileNotFoundError(f"{problem}: {fix}")
            samples = json.loads(_index_path(folder, shard).read_text())["samples"]
            self.index.append([tuple(sample) for sample in samples])
        self.fix = fix
        self._files: dict[int, Any] = {}

    def read(self, shard: int, position: int, key: str) -> Mapping[str, Tensor]:
        """The tensors of sample ``position`` of shard ``shard``, which must be ``key``'s
        (:func:`sample_key`) and hold the bytes written (its CRC-32)."""
        name, offset, size, checksum = self.index[shard][position]
        path = shard_path(self.folder, shard)
        if name != member_name(key):
            raise DamagedShard(
                f"cache shard {path} holds {name} where {member_name(key)} belongs: {self.fix}"
            )
        handle = self._files.get(shard)
        if handle is None:
            handle = self._files[shard] = open(path, "rb")  # noqa: SIM115
        handle.seek(offset)
        payload = handle.read(size)
        if len(payload) != size:
            raise OSError(f"cache shard {path} was truncated while read")
        if zlib.crc32(payload) != checksum:
            raise DamagedShard(
                f"cache shard {path} is damaged (sample {name} does not match its checksum): "
                f"remove it and {self.fix}"
            )
        return load_safetensors(payload)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}}

    def __del__(self) -> None:
        for handle in getattr(self, "_files", {}).values():
            handle.close()
