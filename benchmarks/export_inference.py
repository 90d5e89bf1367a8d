"""Inference benchmark: the exported model (normalizers folded) vs the student + ``inverse``.

PHI-S A.6 claims normalization costs nothing at run time once the inverse is folded into the
adaptor's last linear layer. Both sides compute the same outputs from the same weights, in
one process:

* unfolded: pixel normalization, the training student (``CPEViT``, σReparam active), each
  teacher's adaptor heads, then each feature map through ``normalizer.inverse``
  (what ``predict_step`` did before export existed);
* unfolded, σReparam folded: the same with the student's σReparam folded into plain weights,
  so that the difference to the exported model is the normalizer fold alone;
* exported: ``RadioLitModel`` from :func:`radio_lit.export.inference_model` (what
  ``radio-lit export`` writes and ``radio_lit.load`` returns): σReparam and the normalizers
  folded, RADIO's layout.

The student is a ViT-B/16 (timm ``vit_base_patch16_224``, random weights) at 224 px with
PHI-S-RADIO's teachers' widths (DFN CLIP ViT-H 1280 / summary 1024, SigLIP so400m 1152 / 1152,
DINOv2-g 1536 / 1536, SAM-H 1280 / none) and PHI-S normalizers fitted on random correlated
features. The sides take turns call by call under ``torch.inference_mode``; the ratio is
the median over rounds of exported / unfolded time (and exported / σReparam-folded). Peak
memory per side: VmHWM growth on the CPU (reset through ``/proc/self/clear_refs``; glibc
told to return freed memory at once), or ``torch.cuda.max_memory_allocated`` growth on a GPU.
The last line printed is ``ratio (exported / unfolded): X.XXX``.

    python benchmarks/export_inference.py                 # ~1 min on 2 CPU cores
    python benchmarks/export_inference.py --device cuda --batch-size 64 --resolution 432
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

#: (feature width, summary width or None) of PHI-S-RADIO's teachers (PHI-S A.7).
TEACHERS = {
    "dfn_clip": (1280, 1024),
    "siglip": (1152, 1152),
    "dino_v2": (1536, 1536),
    "sam": (1280, None),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm student model")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=20, help="timed calls per side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per side")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):  # noqa: ANN201 - local types
    import copy

    import torch

    from radio_lit.export import inference_model
    from radio_lit.export.convert import teacher_entry
    from radio_lit.normalizers import PhiS
    from radio_lit.students import CPEViT, TeacherHeads, fold_spectral_reparam

    torch.manual_seed(0)
    device = torch.device(args.device)
    student = CPEViT(args.model, num_cls_tokens=len(TEACHERS), cpe_align_corners=False).eval()
    hidden = max(max(f, s or 0) for f, s in TEACHERS.values())
    heads, normalizers, entries = {}, {}, []
    for slot, (name, (width, summary)) in enumerate(TEACHERS.items()):
        heads[name] = TeacherHeads(student.embed_dim, hidden, width, summary)
        mixing = torch.randn(width, width, dtype=torch.float64) / width**0.5
        normalizers[name] = PhiS(width)
        normalizers[name].update(torch.randn(4 * width, width, dtype=torch.float64) @ mixing)
        normalizers[name].fit()
        entries.append(teacher_entry(name, "generic", {}, summary is not None, slot))
    mean, std = student.pixel_mean, student.pixel_std
    size = (args.resolution, args.resolution)
    exported = inference_model(student, heads, normalizers, entries, mean, std, size)
    plain_student = fold_spectral_reparam(copy.deepcopy(student)).to(device)
    student.to(device)
    exported.to(device)
    for module in (*heads.values(), *normalizers.values()):
        module.to(device).eval()

    mean_t = torch.tensor(mean, device=device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def unfolded_with(trunk: CPEViT):  # noqa: ANN202
        def run(images: torch.Tensor) -> dict:
            out = trunk((images - mean_t) / std_t)
            result = {}
            for slot, (name, head) in enumerate(heads.items()):
                features = normalizers[name].inverse(head.features(out.features))
                summary = head.summary(out.summary[:, slot]) if head.summary is not None else None
                result[name] = (summary, features)
            return result

        return run

    images = torch.rand(args.batch_size, 3, *size, device=device)
    sides = {
        "unfolded": unfolded_with(student),
        "σ-folded": unfolded_with(plain_student),
        "exported": exported,
    }
    return sides, images


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_mib(run, images, device) -> float:  # noqa: ANN001
    """Peak memory growth of one call (MiB): CUDA allocator, else resident set (VmHWM)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run(images)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = _status_kib("VmRSS")
    run(images)
    return (_status_kib("VmHWM") - base) / 1024


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        # glibc then returns freed tensor memory at once, so RSS follows live memory.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        script = str(Path(__file__).resolve())
        os.execve(sys.executable, [sys.executable, script, *(argv or sys.argv[1:])], env)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sides, images = build(args)
    device = images.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        reference, candidate = sides["unfolded"](images), sides["exported"](images)
        worst = max(
            (candidate[name].features - reference[name][1]).abs().max().item() for name in TEACHERS
        )
        for _ in range(args.warmup):
            for run in sides.values():
                run(images)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(args.pairs):
            order = list(sides)[i % len(sides) :] + list(sides)[: i % len(sides)]
            for name in order:
                sync()
                start = time.perf_counter()
                sides[name](images)
                sync()
                times[name].append(time.perf_counter() - start)
        memory = {name: peak_memory_mib(run, images, device) for name, run in sides.items()}

    def ratio(base: str) -> float:
        pairs = zip(times["exported"], times[base], strict=True)
        return statistics.median(e / u for e, u in pairs)

    print(
        f"{args.model} at {args.resolution} px, batch {args.batch_size}, {device}, "
        f"{torch.get_num_threads()} threads, {args.pairs} pairs"
    )
    print(f"largest feature difference (teacher space): {worst:.2e}")
    for name in sides:
        print(
            f"  {name:8s} median {statistics.median(times[name]) * 1e3:8.1f} ms, "
            f"peak memory +{memory[name]:.0f} MiB"
        )
    print(f"ratio (exported / unfolded with σReparam folded): {ratio('σ-folded'):.3f}")
    print(f"ratio (exported / unfolded): {ratio('unfolded'):.3f}")


if __name__ == "__main__":
    main()
