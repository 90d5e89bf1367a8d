"""Data loading at stage-1 rates: images per second of the stage recipes' data path.

What a stage-1 GPU needs (issue "Fast on GPUs"): ~3.25 TFLOP per image (teachers' forwards,
the student's forward and backward), so half of an H100's 989 dense bf16 TFLOP/s is
``0.5 * 989 / 3.25 = 152`` images/s per GPU (the one measured H100 run trained at ~40).

The data path measured is the recipes' own: :class:`radio_lit.data.ImageFolderDataModule` and
:class:`radio_lit.data.WebDatasetDataModule` (tar shards, DataComp / img2dataset layout), with
the recipes' crop side and batch (``configs/stage1.yaml``: 384 px crops, batch 32), real JPEG
decoding of the photographs shipped with the package (``radio_lit:sample_images``, 300-512 px)
and, with ``--upscale SIDE``, the same photographs re-encoded at SIDE px on their long side
(web images such as DataComp's are often larger than the crop: decoding then dominates).
Shards are written once into a temporary folder from those files (the same bytes).

Printed:

* per image, in this process: decode (``load_rgb``), the random-resized crop, the conversion to
  a tensor, and the training path that decodes a large JPEG at a reduced scale
  (``RandomResizedCrop.read``), interleaved in alternating order (medians over ``--images``
  draws);
* through the real training DataLoader (``train_dataloader()``: torchdata's
  ``StatefulDataLoader``, workers, collation), for each ``--workers`` count: images/s after
  ``--warmup`` batches, the median of ``--repeats`` runs, and the workers one GPU would need for
  152 images/s at that rate per worker.

    python benchmarks/data_loading.py                          # folder + shards, 0/1/2 workers
    python benchmarks/data_loading.py --upscale 1024 --workers 0 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

#: FLOPs per stage-1 image (issue "Fast on GPUs": teachers' forwards + student forward and
#: backward at the recipe's sizes) and the H100's dense bf16 peak (data sheet).
STAGE1_TFLOP_PER_IMAGE = 3.25
H100_PEAK_TFLOPS = 989.0
#: Images per second one GPU needs to run stage 1 at half the H100's peak.
STAGE1_NEED = 0.5 * H100_PEAK_TFLOPS / STAGE1_TFLOP_PER_IMAGE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crop-size", type=int, default=384, help="crop side (stage 1: 384)")
    parser.add_argument("--batch-size", type=int, default=32, help="per GPU (stage 1: 32)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batches", type=int, default=8, help="timed batches per run (8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per run (2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (3)")
    parser.add_argument("--images", type=int, default=100, help="per-image draws (100)")
    parser.add_argument("--upscale", type=int, default=None, help="re-encode at SIDE px")
    parser.add_argument("--source", choices=("folder", "shards", "both"), default="both")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.warmup < 0 or args.repeats < 1 or min(args.workers) < 0:
        parser.error("--batches and --repeats must be >= 1, --warmup and --workers >= 0")
    return args


def photographs(folder: Path, upscale: int | None) -> Path:
    """The shipped photographs, or copies re-encoded with their long side at ``upscale`` px
    (bicubic, JPEG quality 90) in ``folder``."""
    from PIL import Image

    from radio_lit.data.image_folder import list_images, sample_images_dir

    if upscale is None:
        return sample_images_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for path in list_images(sample_images_dir()):
        with Image.open(path) as image:
            scale = upscale / max(image.size)
            size = (round(image.width * scale), round(image.height * scale))
            image.convert("RGB").resize(size, Image.Resampling.BICUBIC).save(
                folder / f"{path.stem}.jpg", quality=90
            )
    return folder


def write_shards(images: Path, folder: Path, copies: int) -> str:
    """``copies`` tar shards in webdataset layout, each holding every image of ``images``;
    returns their brace pattern."""
    import webdataset as wds

    from radio_lit.data.image_folder import list_images

    folder.mkdir(parents=True, exist_ok=True)
    paths = list_images(images)
    for shard in range(copies):
        with wds.TarWriter(str(folder / f"{shard:05d}.tar")) as sink:
            for index, path in enumerate(paths):
                sink.write({"__key__": f"{shard:05d}{index:04d}", "jpg": path.read_bytes()})
    return str(folder / f"{{00000..{copies - 1:05d}}}.tar")


def per_image_ms(images: Path, crop_size: int, draws: int) -> dict[str, float]:
    """Median milliseconds per image (this process) of decode, crop and tensor conversion
    done one after the other, and of the training path that decodes at a reduced scale
    (``RandomResizedCrop.read``), interleaved draw by draw (in alternating order) so that
    both see the same load."""
    import torch
    from torchvision.transforms import v2

    from radio_lit.data.image_folder import list_images
    from radio_lit.data.transforms import load_rgb, train_transform

    paths = list_images(images)
    transform = train_transform(crop_size)
    crop, to_tensor = transform.crop, v2.PILToTensor()
    phases = ("decode", "crop", "to tensor", "full decode, crop", "reduced-scale read")
    times: dict[str, list[float]] = {phase: [] for phase in phases}
    torch.manual_seed(0)
    for draw in range(draws):
        path = paths[draw % len(paths)]
        if draw % 2:  # alternate which path goes first: on a loaded machine the second of
            _time_read(transform, path, times)  # two calls is preempted more often
        start = time.perf_counter()
        image = load_rgb(path)
        decoded = time.perf_counter()
        cropped = crop(image)
        cropped_at = time.perf_counter()
        to_tensor(cropped)
        end = time.perf_counter()
        times["decode"].append(decoded - start)
        times["crop"].append(cropped_at - decoded)
        times["to tensor"].append(end - cropped_at)
        times["full decode, crop"].append(end - start)
        if not draw % 2:
            _time_read(transform, path, times)
    return {phase: 1e3 * statistics.median(values) for phase, values in times.items()}


def _time_read(transform, path: Path, times: dict[str, list[float]]) -> None:  # noqa: ANN001
    start = time.perf_counter()
    transform.read(path)
    times["reduced-scale read"].append(time.perf_counter() - start)


def loader_rate(datamodule, batches: int, warmup: int) -> float:
    """Images/s of ``datamodule``'s training loader after ``warmup`` batches."""
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    count = 0
    for _ in range(batches):
        count += next(iterator).shape[0]
    elapsed = time.perf_counter() - start
    del iterator, loader  # ends the workers
    return count / elapsed


def datamodule(source: str, location: str, args: argparse.Namespace, workers: int):
    """The recipes' datamodule for ``source`` at the benchmark's crop, batch and ``workers``."""
    from radio_lit.data import ImageFolderDataModule, WebDatasetDataModule

    needed = (args.warmup + args.batches) * args.batch_size
    if source == "folder":
        return ImageFolderDataModule(
            train_dir=location,
            crop_size=args.crop_size,
            batch_size=args.batch_size,
            num_workers=workers,
            repeats=max(1, math.ceil(needed / 10) + args.batch_size),
        )
    return WebDatasetDataModule(
        urls=location,
        samples_per_epoch=needed + args.batch_size * max(1, workers),
        crop_size=args.crop_size,
        batch_size=args.batch_size,
        num_workers=workers,
        shuffle_buffer=100,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        images = photographs(Path(tmp) / "images", args.upscale)
        sources = {"folder": str(images)}
        if args.source != "folder":
            sources["shards"] = write_shards(images, Path(tmp) / "shards", copies=4)
        if args.source == "shards":
            del sources["folder"]
        size = f"long side {args.upscale} px" if args.upscale else "as shipped (300-512 px)"
        print(f"photographs: {size}; crop {args.crop_size} px, batch {args.batch_size}")
        print(f"stage 1 at half an H100's peak needs {STAGE1_NEED:.0f} images/s per GPU\n")

        ms = per_image_ms(images, args.crop_size, args.images)
        print("per image, one process (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
        full, read = ms["full decode, crop"], ms["reduced-scale read"]
        print(
            f"  -> one worker before collation: {1e3 / read:.0f} images/s "
            f"({1e3 / full:.0f} decoding at full size: {full / read:.2f}x)\n"
        )

        print(
            "| source | workers | images/s (median of runs) | runs | workers per GPU for "
            f"{STAGE1_NEED:.0f}/s |"
        )
        print("| --- | ---: | ---: | --- | ---: |")
        for source, location in sources.items():
            for workers in args.workers:
                rates = [
                    loader_rate(
                        datamodule(source, location, args, workers), args.batches, args.warmup
                    )
                    for _ in range(args.repeats)
                ]
                rate = statistics.median(rates)
                per_worker = rate / max(1, workers)
                need = math.ceil(STAGE1_NEED / per_worker)
                runs = ", ".join(f"{r:.0f}" for r in rates)
                print(f"| {source} | {workers} | {rate:.0f} | {runs} | {need} |")


if __name__ == "__main__":
    main()
