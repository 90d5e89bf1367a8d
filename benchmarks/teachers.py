"""Teacher benchmark: building a large teacher from a weights file, and one forward per family.

1. **Build + load.** A ViT-g-sized teacher (timm ``vit_giant_patch14_reg4_dinov2``, 1.1 B
   parameters, 4.5 GB in float32) is saved to a safetensors file in a temporary directory,
   then built from it twice, each in a fresh process:

   * plain: ``timm.create_model`` (random initialization) then ``load_state_dict`` of the
     file's tensors (two copies of the weights while loading);
   * radio-lit: ``DINOv2Teacher(checkpoint=file)``: the model is built on the meta device and
     the file's tensors are assigned (``load_state_dict(assign=True)``), one copy.

   Reported: wall time of build + load, and peak memory growth over the process's baseline
   (on the CPU ``VmHWM`` growth, the mark reset through ``/proc/self/clear_refs``; on a GPU
   ``torch.cuda.max_memory_allocated``, the model then moved there) against the weights'
   size, right after loading and again after reading every weight once (safetensors files are
   memory-mapped: assigned tensors stay pages of the file until first read, which the second
   number counts). Both paths read the file the same way (``safetensors`` memory map);
   ``torch.load`` of a pickle would add a copy to the plain path.

2. **One forward per family at real widths** (random weights, no download): SigLIP2-g
   (timm ``vit_giantopt_patch16_siglip_384``, open_clip's ``ViT-gopt-16-SigLIP2-384``
   trunk) at 384 px, DINOv3-7B (timm ``vit_7b_patch16_dinov3``) at 256 px, SAM2 Hiera-L
   (transformers ``Sam2VisionModel``) and SAM3 (``Sam3VisionModel``) at 1024 / 1008 px,
   through the radio-lit teacher classes. ``--depth N`` keeps every width and shortens each
   model to N blocks (CPU runs); img/s is then per N blocks. Without ``--depth`` the models
   are full size (a GPU: ``--device cuda --dtype bfloat16``).

    python benchmarks/teachers.py --depth 2                      # ~6 min on 2 CPU cores
    python benchmarks/teachers.py --device cuda --dtype bfloat16 --batch-size 8
    python benchmarks/teachers.py --skip-build --families sam3   # one family
    python benchmarks/teachers.py --skip-build --depth 2 --channels-last   # teachers' option
    python benchmarks/teachers.py --skip-build --depth 4 --precision  # bf16 against float32

``--precision`` compares, per family and on the same random weights and crops, the features
of the float32 teacher (the reference) with those of the float32 teacher under bf16 autocast
(what a ``bf16-mixed`` run does with a float32 teacher) and of the teacher held in bfloat16
under the same autocast (``dtype: bfloat16``, the stage recipes' setting): relative L2 error
and the mean cosine per token, and the autocast casts (``aten::_to_copy``) each forward makes.

The forward part also counts the forward's top-level aten operations and, among them, the
layout copies (``contiguous``, ``clone``, ``copy_``, ``_to_copy``) that ``channels_last``
should remove around convolutions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.dispatch import count_operations  # noqa: E402

BIG = "vit_giant_patch14_reg4_dinov2"

#: Hiera-L (SAM2.1 hiera_large): Sam2VisionConfig's backbone overrides.
HIERA_L: dict[str, Any] = {
    "model_type": "sam2_hiera_det_model",
    "hidden_size": 144,
    "blocks_per_stage": [2, 6, 36, 4],
    "embed_dim_per_stage": [144, 288, 576, 1152],
    "num_attention_heads_per_stage": [2, 4, 8, 16],
    "window_size_per_stage": [8, 4, 16, 8],
    "global_attention_blocks": [23, 33, 43],
    "window_positional_embedding_background_size": [7, 7],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--channels-last", action="store_true", help="teachers' channels_last")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per family")
    parser.add_argument("--depth", type=int, default=None, help="blocks per model (CPU runs)")
    parser.add_argument(
        "--families",
        nargs="*",
        default=["siglip2", "dinov3", "sam2", "sam3"],
        help="families of the forward part (none: build part only)",
    )
    parser.add_argument("--skip-build", action="store_true", help="no build + load part")
    parser.add_argument("--precision", action="store_true", help="bf16 against float32 part")
    parser.add_argument("--build-model", default=BIG, help="timm model of the build part")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)  # path, file, device
    return parser.parse_args(argv)


# -- 1. build + load ------------------------------------------------------------------------
def _status_mib(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in MiB (``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _reset_peak() -> float:
    """Reset the peak-RSS mark (``/proc/self/clear_refs``) and return the current RSS (MiB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def child(path: str, file: str, device: str, model: str) -> dict[str, float]:
    """Build ``model`` from ``file`` by ``path`` in this (fresh) process; time and peak memory."""
    import torch

    import radio_lit.teachers as teachers  # imports done before the baseline
    from radio_lit.teachers.loading import read_state_dict

    cuda = device.startswith("cuda")
    base = torch.cuda.memory_allocated() if cuda else _reset_peak()
    start = time.perf_counter()
    if path == "plain":
        import timm

        net = timm.create_model(model, pretrained=False)
        net.load_state_dict(read_state_dict(file))
    else:
        net = teachers.DINOv2Teacher(model, pretrained=False, checkpoint=file).model
    if cuda:
        net.to(device)
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (
        (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _status_mib("VmHWM") - base
    )
    # assigned tensors may still be pages of the memory-mapped file: read every weight once,
    # as the first forward does, and measure again
    with torch.no_grad():
        sum(float(p.float().sum()) for p in net.parameters())
    touched = (
        (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _status_mib("VmHWM") - base
    )
    return {"seconds": seconds, "peak_mib": peak, "touched_mib": touched}


def build_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    import timm
    from safetensors.torch import save_file

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "teacher.safetensors"
        net = timm.create_model(args.build_model, pretrained=False)
        state = {k: v.contiguous() for k, v in net.state_dict().items()}
        weights_mib = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
        save_file(state, str(file))
        del net, state
        for path in ("plain", "radio-lit"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--_child",
                    path,
                    str(file),
                    args.device,
                    "--build-model",
                    args.build_model,
                ],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"path": path, "weights_mib": weights_mib, **result})
    return rows


# -- 2. one forward per family ---------------------------------------------------------------
def family(name: str, depth: int | None, dtype: str, channels_last: bool = False):  # noqa: ANN201
    """The teacher of family ``name`` (a Teacher), random weights."""
    from radio_lit.teachers import DINOv3Teacher, SAM2Teacher, SAM3Teacher, TimmTeacher

    blocks = {} if depth is None else {"depth": depth}
    options = {"dtype": dtype, "channels_last": channels_last}
    if name == "siglip2":
        return TimmTeacher(
            "vit_giantopt_patch16_siglip_384", pretrained=False, model_kwargs=blocks, **options
        )
    if name == "dinov3":
        return DINOv3Teacher(
            "vit_7b_patch16_dinov3",
            pretrained=False,
            resolution=256,
            model_kwargs=blocks,
            **options,
        )
    if name == "sam2":
        hiera = dict(HIERA_L)
        if depth is not None:  # keep the 4 stages (widths), shorten the deepest; a global
            # block first in a pooling stage is not supported by transformers' Hiera
            hiera["blocks_per_stage"] = [1, 1, max(2, depth), 1]
            hiera["global_attention_blocks"] = [3]
        return SAM2Teacher(
            "sam2_vision_model",
            pretrained=False,
            model_kwargs={"backbone_config": hiera},
            **options,
        )
    if name == "sam3":
        vit: dict[str, Any] = {"model_type": "sam3_vit_model"}
        if depth is not None:
            vit.update(num_hidden_layers=depth, global_attn_indexes=[depth - 1])
        return SAM3Teacher(
            "sam3_vision_model",
            pretrained=False,
            model_kwargs={"backbone_config": vit},
            **options,
        )
    raise ValueError(f"unknown family {name!r}")


#: Operations that copy a tensor into another memory layout.
_LAYOUT_COPIES = ("aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy")


def _forward(teacher: Any, crop: Any, cuda: bool) -> None:
    import torch

    teacher(crop)
    if cuda:
        torch.cuda.synchronize()


def forward_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    rows = []
    for name in args.families:
        torch.manual_seed(0)
        with torch.device(args.device):  # random initialization where the model runs
            dtype = None if args.dtype == "float32" else args.dtype
            teacher = family(name, args.depth, dtype, args.channels_last)
        teacher.to(args.device)
        params = sum(p.numel() for p in teacher.parameters())
        side = teacher.resolution
        crop = torch.rand(args.batch_size, 3, side, side, device=args.device)
        cuda = args.device.startswith("cuda")

        with torch.inference_mode():
            _, operations = count_operations(partial(_forward, teacher, crop, cuda))  # warm-up
            start = time.perf_counter()
            for _ in range(args.repeats):
                _forward(teacher, crop, cuda)
            seconds = (time.perf_counter() - start) / args.repeats
        rows.append(
            {
                "family": name,
                "params_m": params / 1e6,
                "resolution": side,
                "features": teacher.feature_dim,
                "img_s": args.batch_size / seconds,
                "ops": operations.top_level,
                "copies": sum(operations.by_name[op] for op in _LAYOUT_COPIES),
            }
        )
        del teacher
    return rows


def precision_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per family: the features of a float32 teacher under bf16 autocast and of the same
    teacher held in bfloat16, each against the float32 teacher's."""
    import torch

    rows = []
    for name in args.families:
        torch.manual_seed(0)
        full = family(name, args.depth, None).to(args.device)
        half = family(name, args.depth, "bfloat16").to(args.device)
        half.model.load_state_dict(full.model.state_dict())  # the same weights, rounded
        side = full.resolution
        crop = torch.rand(args.batch_size, 3, side, side, device=args.device)
        device_type = torch.device(args.device).type
        with torch.inference_mode():
            reference = full(crop).features
            for label, teacher in (("float32 under autocast", full), ("bfloat16", half)):
                autocast = torch.autocast(device_type, dtype=torch.bfloat16)
                with autocast, torch.profiler.profile() as profiled:
                    features = teacher(crop).features
                casts = sum(1 for e in profiled.events() if e.name == "aten::_to_copy")
                features, expected = features.double(), reference.double()
                error = (features - expected).norm() / expected.norm()
                cosine = torch.nn.functional.cosine_similarity(features, expected, dim=-1)
                rows.append(
                    {
                        "family": name,
                        "teacher": label,
                        "error": float(error),
                        "cosine": float(cosine.mean()),
                        "casts": casts,
                    }
                )
        del full, half
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child:
        path, file, device = args._child
        print(json.dumps(child(path, file, device, args.build_model)))
        return
    import torch

    print(
        f"torch {torch.__version__}, device {args.device}, dtype {args.dtype}, "
        f"threads {torch.get_num_threads()}, depth {args.depth or 'full'}"
    )
    if not args.skip_build:
        rows = build_part(args)
        print(f"\nbuild + load of {args.build_model} from a local safetensors file")
        print(
            "| path | build + load | peak memory growth | / weights | after reading every weight |"
        )
        print("| --- | ---: | ---: | ---: | ---: |")
        for row in rows:
            w = row["weights_mib"]
            print(
                f"| {row['path']} | {row['seconds']:.1f} s | {row['peak_mib'] / 1024:.2f} GiB "
                f"| {row['peak_mib'] / w:.2f}x | {row['touched_mib'] / w:.2f}x |"
            )
        plain, fast = rows
        print(
            f"speed-up: {plain['seconds'] / fast['seconds']:.1f}x, weights "
            f"{plain['weights_mib'] / 1024:.2f} GiB"
        )
    if not args.families:
        return
    if args.precision:
        print(f"\nfeatures against the float32 teacher's (batch {args.batch_size}, bf16 autocast)")
        print("| family | teacher | relative L2 error | mean cosine | casts per forward |")
        print("| --- | --- | ---: | ---: | ---: |")
        for row in precision_part(args):
            print(
                f"| {row['family']} | {row['teacher']} | {row['error']:.2e} "
                f"| {row['cosine']:.5f} | {row['casts']} |"
            )
        return
    rows = forward_part(args)
    layout = ", channels-last" if args.channels_last else ""
    print(f"\none forward per family (batch {args.batch_size}, {args.dtype}{layout})")
    print("| family | parameters | resolution | feature width | img/s | top-level ops | copies |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['family']} | {row['params_m']:.0f} M | {row['resolution']} px "
            f"| {row['features']} | {row['img_s']:.2f} | {row['ops']} | {row['copies']} |"
        )


if __name__ == "__main__":
    main()
