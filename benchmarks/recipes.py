"""Recipe benchmarks: SAM mosaics, per-teacher partitions, the student across resolutions.

Three measurements in one run, each reported as a ratio taken within the run:

1. **SAM mosaic** (RADIOv2.5 4.3): SAM encoder forwards and wall time per student image,
   pad-and-crop vs mosaic, at SAM's real geometry (1024 px input, 16 px patches) with student
   views of 256 px (4x4 mosaics) and 432 px (2x2 mosaics, 80 px padding). The encoder is thin
   (``--sam-width``, depth 2) so the run fits a CPU; the geometry, and so the counts, are the
   paper's. Goal: forwards / k^2 exactly, wall time at least 0.8 k^2 times faster.
2. **Partitions** (PHI-S 3 vs RADIOv2.5 4.6): teacher compute per student image with one
   partition (every teacher on every image) vs one partition per teacher (each teacher on its
   own share of the images), with the quickstart's tiny CLIP, DINOv2 and SAM teachers.
3. **Student step across resolutions** (RADIOv2.5 4.2): forward + backward of the quickstart
   student and its heads per image at several resolutions.

    python benchmarks/recipes.py                 # ~1-2 min on 2 CPUs
    python benchmarks/recipes.py --device cuda   # the same on a GPU
    python benchmarks/recipes.py --help
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from radio_lit.module import DistillationModule  # noqa: E402
from radio_lit.teachers import SAMTeacher  # noqa: E402
from radio_lit.training.partitions import Partition  # noqa: E402


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs, after one warm-up run."""
    fn()
    sync, times = harness.synchronizer(device), []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sam_mosaic(args: argparse.Namespace, device: torch.device) -> None:
    print("\n1. SAM mosaic (RADIOv2.5 4.3): 1024 px encoder, per student image")
    encoder = {
        "img_size": 1024,
        "patch_size": 16,
        "embed_dim": args.sam_width,
        "depth": 2,
        "num_heads": 2,
        "window_size": 14,
        "global_attn_indexes": [1],
        "use_rel_pos": True,
        "out_chans": 16,
    }
    print(
        f"{'view':>6} {'k':>3} {'pad':>4} {'fwd/img plain':>14} {'fwd/img mosaic':>15} "
        f"{'ms/img plain':>13} {'ms/img mosaic':>14} {'speed-up':>9} {'0.8 k^2':>8}"
    )
    for side in (256, 432):
        teachers = {
            mode: SAMTeacher(encoder_kwargs=encoder, resolution=side, mosaic=mode).to(device)
            for mode in (False, True)
        }
        teachers[True].model.load_state_dict(teachers[False].model.state_dict())
        layout = teachers[True].model.img_size // side
        images = 2 * layout * layout  # two full mosaics
        crop = torch.rand(images, 3, side, side, device=device)
        forwards: dict[bool, int] = {}
        seconds: dict[bool, float] = {}
        for mode, sam in teachers.items():
            count = [0]
            hook = sam.model.register_forward_pre_hook(
                lambda _, a, c=count: c.__setitem__(0, c[0] + a[0].shape[0])
            )
            sam(crop)
            forwards[mode] = count[0]
            hook.remove()
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                seconds[mode] = timed(lambda s=sam, c=crop: s(c), device, args.repeats)
        k2 = layout * layout
        pad = teachers[True].model.img_size // layout - side
        speedup = seconds[False] / seconds[True]
        print(
            f"{side:>6} {layout:>3} {pad:>4} {forwards[False] / images:>14.4f} "
            f"{forwards[True] / images:>15.4f} {1e3 * seconds[False] / images:>13.2f} "
            f"{1e3 * seconds[True] / images:>14.2f} {speedup:>8.2f}x {0.8 * k2:>8.1f}"
        )


def quickstart(*overrides: str) -> DistillationModule:
    return harness.parse(harness.QUICKSTART, *harness.BARE_TRAINER, *overrides).model


def partitions(args: argparse.Namespace, device: torch.device) -> None:
    print("\n2. Teacher compute per student image: one partition vs one per teacher (PHI-S 3)")
    one = quickstart().to(device)
    names = list(one.teachers)
    per_teacher = DistillationModule(
        student=one.student,
        teachers=dict(one.teachers),
        student_resolution=one.student_resolution,
        partitions={n: Partition(teachers=[n], batch_size=args.batch) for n in names},
    ).to(device)
    crop = torch.rand(args.batch * len(names), 3, 128, 128, device=device)
    rows = {}
    for label, module in (("one partition", one), ("per teacher", per_teacher)):
        chunks = module.partitions.chunks(crop, train=True)
        used = sum(len(c.crop) for c in chunks)

        def run(m: DistillationModule = module, cs: list = chunks) -> None:
            for c in cs:
                m.run_teachers(c.crop, c.teachers, c.resolution)

        rows[label] = timed(run, device, args.repeats) / used
        forwards = sum(len(c.crop) * len(c.teachers) for c in chunks) / used
        print(
            f"{label:>14}: {used} images/step, {forwards:.2f} teacher forwards/image, "
            f"{1e3 * rows[label]:.2f} ms of teachers/image"
        )
    print(
        f"ratio (one partition / per teacher): {rows['one partition'] / rows['per teacher']:.2f}"
        f" (teachers: {len(names)})"
    )


def student_resolutions(args: argparse.Namespace, device: torch.device) -> None:
    print("\n3. Student step (forward + backward, student and heads) across resolutions")
    module = quickstart().to(device)
    base = None
    for side in args.resolutions:
        view = torch.rand(args.batch, 3, side, side, device=device)

        def step(m: DistillationModule = module, v: torch.Tensor = view) -> None:
            out = m.student(v)
            loss = sum(h.features(out.features).square().mean() for h in m.heads.values())
            loss.backward()

        seconds = timed(step, device, args.repeats) / args.batch
        base = base or seconds
        tokens = (side // module.student.patch_size) ** 2
        print(
            f"{side:>6} px: {tokens:>5} tokens, {1e3 * seconds:8.2f} ms/image, "
            f"{seconds / base:6.2f}x the {args.resolutions[0]} px cost"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median)")
    parser.add_argument("--batch", type=int, default=8, help="images per partition / step")
    parser.add_argument("--sam-width", type=int, default=32, help="SAM encoder width")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--only", choices=["mosaic", "partitions", "student"], default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    harness.quiet()
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"device {device}, torch threads {torch.get_num_threads()}, repeats {args.repeats}")
    with torch.no_grad():
        if args.only in (None, "mosaic"):
            sam_mosaic(args, device)
        if args.only in (None, "partitions"):
            partitions(args, device)
    if args.only in (None, "student"):
        student_resolutions(args, device)


if __name__ == "__main__":
    main()
