"""Student speed: E-RADIO against the ViT at the same resolution, and onnxruntime against PyTorch.

Part 1 (AM-RADIO section 5: E-RADIO "at least 6x faster than the teachers at matched
resolution"): the forward of E-RADIO-B / -L (:class:`radio_lit.students.ERadio`, widths 128 /
192) and of the CPE ViT-B/16 / ViT-L/16 students (:class:`radio_lit.students.CPEViT` on timm's
``vit_base_patch16_224`` / ``vit_large_patch16_224``), random weights, eval mode, under
``torch.inference_mode``, on the same input. The pair's calls alternate; each ratio is the
median over rounds of ViT time / E-RADIO time (above 1: E-RADIO is faster).

Part 2: the exported E-RADIO-B inference model (:func:`radio_lit.export.inference_model`, one
teacher head of width 1024) in PyTorch on the CPU against the same model exported to ONNX
(:func:`radio_lit.export.save_onnx`) and run by onnxruntime's CPU provider; ratio = PyTorch
time / onnxruntime time. Skipped on a GPU device or without ``radio-lit[onnx]``.

    python benchmarks/students.py                          # 512 px, batch 1, CPU
    python benchmarks/students.py --sizes L --batch-size 4 --no-onnx --threads 1
    python benchmarks/students.py --device cuda --dtype bfloat16 --resolution 512 --batch-size 32
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radio_lit.export import inference_model, save_onnx  # noqa: E402
from radio_lit.normalizers import Identity  # noqa: E402
from radio_lit.students import CPEViT, ERadio, TeacherHeads  # noqa: E402

PAIRS = {
    "B": (lambda: ERadio(width=128), lambda: CPEViT("vit_base_patch16_224")),
    "L": (lambda: ERadio(width=192), lambda: CPEViT("vit_large_patch16_224")),
}


def timed(fn, sync) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def alternate(first, second, rounds: int, sync) -> tuple[float, float, float]:
    """Median seconds of ``first`` and ``second`` called in turn, and the median ratio."""
    first(), second()  # warm-up
    sync()
    a, b = [], []
    for _ in range(rounds):
        a.append(timed(first, sync))
        b.append(timed(second, sync))
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=["B", "L"], choices=sorted(PAIRS))
    parser.add_argument("--no-onnx", action="store_true", help="skip part 2")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    images = torch.randn(args.batch_size, 3, args.resolution, args.resolution, device=device)
    print(
        f"device {device}, {args.dtype}, {args.batch_size} x {args.resolution} px, "
        f"{torch.get_num_threads()} threads"
    )
    print("| size | E-RADIO s | ViT/16 s | ViT / E-RADIO |")
    print("| --- | --- | --- | --- |")
    for size in args.sizes:
        make_eradio, make_vit = PAIRS[size]
        eradio = make_eradio().eval().to(device, dtype)
        vit = make_vit().eval().to(device, dtype)
        x = images.to(dtype)
        with torch.inference_mode():
            t_e, t_v, ratio = alternate(partial(eradio, x), partial(vit, x), args.rounds, sync)
        print(f"| {size} | {t_e:.3f} | {t_v:.3f} | {ratio:.2f} |")

    if args.no_onnx:
        return
    if device.type != "cpu" or importlib.util.find_spec("onnxruntime") is None:
        print("onnxruntime comparison skipped (CPU only, needs radio-lit[onnx])")
        return
    import onnxruntime as ort

    student = ERadio(width=128).eval()
    heads = {"teacher": TeacherHeads(student.embed_dim, 1024, 1024, 1024)}
    teachers = [{"name": "teacher", "type": "generic", "use_summary": True, "token_slot": 0}]
    side = (args.resolution, args.resolution)
    model = inference_model(
        student, heads, {"teacher": Identity(1024)}, teachers, (0.5,) * 3, (0.5,) * 3, side
    )
    pixels = torch.rand(args.batch_size, 3, *side)
    with tempfile.TemporaryDirectory() as folder:
        path = save_onnx(model, Path(folder) / "eradio.onnx", side)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {"images": pixels.numpy()}
        with torch.inference_mode():
            t_t, t_o, ratio = alternate(
                lambda: model(pixels), lambda: session.run(None, feed), args.rounds, sync
            )
    print("| exported E-RADIO-B | PyTorch s | onnxruntime s | PyTorch / onnxruntime |")
    print("| --- | --- | --- | --- |")
    print(f"| {side[0]} px | {t_t:.3f} | {t_o:.3f} | {1 / ratio:.2f} |")


if __name__ == "__main__":
    main()
