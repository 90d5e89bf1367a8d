"""``radio-lit predict``: every image's features, written to safetensors shards with a manifest.

    radio-lit predict --model_path export/last.safetensors --images photos/ --output features/
    radio-lit predict --ckpt_path RUN/checkpoints/last.ckpt --shards "data/{00000..00009}.tar" \
        --output features/ --resolution 432 --dtype float16

The model is an export (``radio-lit export``) or a training checkpoint with its run's
``config.yaml`` (exported on the fly, as :func:`radio_lit.load` does); teachers are never
built. Each image is resized (antialiased bilinear) to the model's preferred resolution (the
student's training resolution) or ``--resolution``, scaled to ``[0, 1]`` and run in batches
through :class:`~radio_lit.export.RadioLitModel`; ``--pad`` accepts a resolution that is not a
multiple of the patch size, as ``radio_lit.load(path, pad=True)``.

Written in ``--output``:

- ``shard-00000.safetensors``, … : for each output ``o`` (``backbone`` and every teacher, in
  the teacher's own space), ``o/summary [N, C_s]`` (absent for a teacher without a summary,
  such as SAM) and ``o/features [N, h, w, C]``, ``h, w`` the patch grid; row ``i`` is the
  ``i``-th image of the shard's entry in the manifest;
- ``manifest.json``: the model, resolution, dtype, the outputs' shapes, and per shard its file
  and image names (paths relative to ``--images``, or ``<shard>/<key>`` for webdataset), plus
  the images that could not be read.

An ``--output`` folder that is not empty is refused in one line naming ``--overwrite``; with
it, the shards an earlier manifest there lists are removed first, so that none of them stays
beside the new manifest.

:func:`read_predictions` reads them back.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from safetensors.torch import load_file
from torch import Tensor
from torchvision.transforms import v2
from tqdm.auto import tqdm

from radio_lit.core.errors import CommandParser, ConfigError, checkpoint_file, device_option
from radio_lit.data.image_folder import list_images, resolve_image_root
from radio_lit.data.shards import decode_image, existing_shard_urls
from radio_lit.data.transforms import UnreadableImageError, load_rgb
from radio_lit.export.files import model_file, refuse_overwrite, save_umask_file

logger = logging.getLogger(__name__)

#: Name of the manifest written beside the shards.
MANIFEST = "manifest.json"

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="radio-lit predict",
        description="Write every image's backbone and teacher-space summary and features "
        "to safetensors shards with a manifest.json.",
    )
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model_path", type=Path, help="an export (.safetensors or .pth)")
    model.add_argument("--ckpt_path", type=Path, help="a training checkpoint (.ckpt)")
    p.add_argument(
        "--run_config",
        type=Path,
        default=None,
        help="with --ckpt_path: the run's config.yaml (default: beside checkpoints/)",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", help="a folder of images, searched recursively")
    source.add_argument("--shards", help="webdataset shards, e.g. 'data/{00000..00009}.tar'")
    p.add_argument("--output", type=Path, required=True, help="folder to write the shards to")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --output (replacing an earlier prediction's shards)",
    )
    p.add_argument(
        "--resolution",
        type=int,
        nargs="+",
        default=None,
        metavar="SIDE",
        help="H [W] the images are resized to (default: the model's preferred resolution)",
    )
    p.add_argument(
        "--pad", action="store_true", help="pad to a multiple of the patch size (radio_lit.load)"
    )
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--images_per_shard", type=int, default=1024, help="images in each output shard")
    p.add_argument("--dtype", choices=list(_DTYPES), default="float32", help="stored dtype")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def resize_image(image: Image.Image, size: tuple[int, int]) -> Tensor:
    """An RGB image resized to ``size = (H, W)`` (antialiased bilinear) -> ``[3, H, W]`` in
    ``[0, 1]``, as the model takes it."""
    resized = v2.functional.resize(v2.functional.pil_to_tensor(image), list(size), antialias=True)
    return resized.float() / 255.0


def folder_images(root: str) -> Iterator[tuple[str, Image.Image | None]]:
    """``(relative path, image)`` of every image under ``root``; ``None`` if unreadable."""
    base = resolve_image_root(root)
    for path in list_images(root):
        name = path.relative_to(base).as_posix()
        try:
            yield name, load_rgb(path)
        except UnreadableImageError as error:
            logger.warning("skipping %s", error)
            yield name, None


def shard_images(pattern: str) -> Iterator[tuple[str, Image.Image | None]]:
    """``(<shard file>/<key>, image)`` of every sample of the shards, in order."""
    import webdataset as wds

    urls = existing_shard_urls(pattern)
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        name = f"{Path(str(sample.get('__url__'))).name}/{sample.get('__key__')}"
        try:
            yield name, decode_image(sample)
        except (UnreadableImageError, ValueError) as error:
            logger.warning("skipping %s", error)
            yield name, None


@dataclass
class ShardWriter:
    """Accumulates output rows and writes a safetensors shard every ``images_per_shard``."""

    folder: Path
    images_per_shard: int
    dtype: torch.dtype
    shards: list[dict[str, Any]] = field(default_factory=list)
    _names: list[str] = field(default_factory=list)
    _rows: dict[str, list[Tensor]] = field(default_factory=dict)

    def add(self, names: list[str], outputs: dict[str, Tensor]) -> None:
        start = 0
        while start < len(names):
            take = min(self.images_per_shard - len(self._names), len(names) - start)
            self._names += names[start : start + take]
            for key, value in outputs.items():
                self._rows.setdefault(key, []).append(value[start : start + take])
            start += take
            if len(self._names) == self.images_per_shard:
                self.flush()

    def flush(self) -> None:
        if not self._names:
            return
        name = f"shard-{len(self.shards):05d}.safetensors"
        tensors = {
            k: torch.cat(v).to(self.dtype).contiguous() for k, v in sorted(self._rows.items())
        }
        save_umask_file(tensors, self.folder / name)
        self.shards.append({"file": name, "images": self._names})
        self._names, self._rows = [], {}


def flatten_outputs(outputs: dict[str, Any]) -> dict[str, Tensor]:
    """``{name: TeacherOutput}`` -> ``{"name/summary": [B, C], "name/features": [B, h, w, C]}``
    on the CPU (a ``None`` summary is left out)."""
    flat = {}
    for name, output in outputs.items():
        if output.summary is not None:
            flat[f"{name}/summary"] = output.summary.float().cpu()
        flat[f"{name}/features"] = output.features.float().cpu()
    return flat


def predict(
    model: torch.nn.Module,
    images: Iterator[tuple[str, Image.Image | None]],
    output: Path,
    size: tuple[int, int],
    batch_size: int = 16,
    images_per_shard: int = 1024,
    dtype: torch.dtype = torch.float32,
    total: int | None = None,
    description: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``model`` over ``images`` at ``size`` and write shards and manifest to ``output``.

    Args:
        model: a :class:`~radio_lit.export.RadioLitModel` (on its device, eval mode).
        images: ``(name, image)`` pairs; ``None`` images are listed as skipped.
        output: the folder to write to (created).
        size: ``(H, W)`` the images are resized to.
        batch_size: images per forward.
        images_per_shard: images per written shard.
        dtype: dtype of the stored tensors.
        total: the number of images, for the progress bar's time left.
        description: entries added to the manifest (the model's path, ...).

    Returns:
        The manifest, as written.
    """
    output.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    writer = ShardWriter(output, images_per_shard, dtype)
    shapes: dict[str, list[int]] = {}
    skipped: list[str] = []
    batch: list[Tensor] = []
    names: list[str] = []

    def run_batch() -> None:
        with torch.inference_mode():
            flat = flatten_outputs(model(torch.stack(batch).to(device)))
        shapes.update({k: list(v.shape[1:]) for k, v in flat.items()})
        writer.add(list(names), flat)
        batch.clear()
        names.clear()

    with tqdm(images, total=total, unit="img", desc="predict", dynamic_ncols=True) as bar:
        for name, image in bar:
            if image is None:
                skipped.append(name)
                continue
            names.append(name)
            batch.append(resize_image(image, size))
            if len(batch) == batch_size:
                run_batch()
        if batch:
            run_batch()
    writer.flush()
    manifest = {
        **(description or {}),
        "resolution": list(size),
        "dtype": str(dtype).removeprefix("torch."),
        "tensors": shapes,
        "num_images": sum(len(s["images"]) for s in writer.shards),
        "shards": writer.shards,
        "skipped": skipped,
    }
    (output / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_predictions(folder: str | Path) -> tuple[list[str], dict[str, Tensor]]:
    """What ``radio-lit predict`` wrote in ``folder``: the image names, and each tensor
    (``"<output>/summary"``, ``"<output>/features"``) with one row per image, in that order."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    names: list[str] = []
    parts: dict[str, list[Tensor]] = {}
    for shard in manifest["shards"]:
        names += shard["images"]
        for key, value in load_file(str(folder / shard["file"])).items():
            parts.setdefault(key, []).append(value)
    return names, {k: torch.cat(v) for k, v in parts.items()}


def remove_predictions(folder: Path) -> None:
    """Remove what an earlier ``radio-lit predict`` wrote in ``folder``: the shards its
    manifest lists, and the manifest (other files stay)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return
    try:
        shards = [str(s["file"]) for s in json.loads(manifest.read_text()).get("shards", [])]
    except (ValueError, AttributeError, KeyError, TypeError) as error:
        raise ConfigError(
            f"--overwrite: {manifest} cannot be read ({error}); remove it, or give another --output"
        ) from error
    for name in shards:
        if Path(name).name == name:  # a file of this folder, as predict writes them
            (folder / name).unlink(missing_ok=True)
    manifest.unlink()


def main(argv: Sequence[str]) -> None:
    """Entry point of ``radio-lit predict``."""
    import radio_lit

    args = parser().parse_args(list(argv))
    for option in ("batch_size", "images_per_shard"):
        if getattr(args, option) < 1:
            raise ConfigError(f"--{option} must be positive, got {getattr(args, option)}")
    device = device_option(args.device)
    if args.output.exists() and not args.output.is_dir():
        raise ConfigError(f"--output: {args.output} is a file; give a folder for the shards")
    if not args.overwrite:
        refuse_overwrite([args.output], "radio-lit predict")
    if args.ckpt_path is not None:
        source = checkpoint_file(args.ckpt_path, "--ckpt_path")
        model = radio_lit.load(source, pad=args.pad, config=args.run_config)
    else:
        source = model_file(args.model_path, "--model_path")
        model = radio_lit.load(source, pad=args.pad)
    extras = model.config["radio_lit"]
    size = _resolution(args.resolution, extras, args.pad)
    model = model.to(device)
    if args.images is not None:
        total: int | None = len(list_images(args.images))
        images = folder_images(args.images)
    else:
        total, images = None, shard_images(args.shards)
    if args.overwrite:  # the model and images are found: replace the earlier prediction
        remove_predictions(args.output)
    manifest = predict(
        model,
        images,
        args.output,
        size,
        batch_size=args.batch_size,
        images_per_shard=args.images_per_shard,
        dtype=_DTYPES[args.dtype],
        total=total,
        description={
            "model": str(source),
            "source": args.images if args.images is not None else args.shards,
            "patch_size": int(extras["patch_size"]),
            "pad": args.pad,
        },
    )
    print(
        f"{manifest['num_images']} images -> {len(manifest['shards'])} shard(s) in "
        f"{args.output} (manifest: {args.output / MANIFEST})"
    )


def _resolution(given: list[int] | None, extras: dict[str, Any], pad: bool) -> tuple[int, int]:
    """``(H, W)``: ``--resolution H [W]``, else the export's preferred resolution."""
    if given is None:
        height, width = (int(s) for s in extras["preferred_resolution"])
    elif len(given) in (1, 2) and min(given) > 0:
        height, width = given[0], given[-1]
    else:
        raise ConfigError(f"--resolution takes one or two positive sides (H [W]), got {given}")
    patch = int(extras["patch_size"])
    if not pad and (height % patch or width % patch):
        raise ConfigError(
            f"--resolution {height} {width} is not a multiple of the patch size {patch}; give "
            f"e.g. {height - height % patch or patch}, or add --pad"
        )
    return height, width
