"""What the stage-1 student's training step dispatches, unsharded and under each FSDP2 layout,
with DAMP or without: top-level aten operations (and FLOPs) of its forward and backward.

The student of ``configs/stage1.yaml`` (CPE ViT-L/16, σReparam version 1, 4 summary tokens) at
256 px, batch 2, float32, random weights, training mode, inside
:func:`radio_lit.students.spectral_reparam.spectral_step` as ``training_step`` runs it; loss
``features.sum() + summary.sum()``. Under FSDP2 it is sharded by
:func:`radio_lit.students.shard_student` with ``FSDP2(layout=...)`` on one gloo rank of this
process (FSDP2's own operations are counted: its copies of the gathered weights, its
reduce-scatter). The second step is counted (the first runs FSDP2's lazy initialisation).
Operation counts do not depend on the machine's load, nor on the width (``--width 64`` counts
the same in seconds); FLOPs (``--flops``, forward only, ``FlopCounterMode``) do on the width.

    python benchmarks/student_ops.py                                 # unsharded, student, blocks
    python benchmarks/student_ops.py --layouts none --damp --flops   # DAMP's cost
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.dispatch import forward_backward_counts  # noqa: E402
from radio_lit.students import CPEViT  # noqa: E402
from radio_lit.students.damp import DAMP  # noqa: E402
from radio_lit.students.spectral_reparam import spectral_step  # noqa: E402

PRODUCTS = ("aten::linear", "aten::mm", "aten::bmm", "aten::matmul")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layouts", nargs="+", default=["none", "student", "blocks"], help="none: unsharded"
    )
    parser.add_argument("--damp", action="store_true", help="also each layout with DAMP(0.1)")
    parser.add_argument("--flops", action="store_true", help="forward FLOPs too")
    parser.add_argument("--width", type=int, default=None, help="embed_dim (default ViT-L's)")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def student(width: int | None) -> CPEViT:
    kwargs = {} if width is None else dict(embed_dim=width, num_heads=4)
    torch.manual_seed(0)
    return CPEViT(
        model="vit_large_patch16_224",
        max_resolution=2048,
        num_cls_tokens=4,
        cpe_align_corners=False,
        model_kwargs=kwargs,
    ).train()


def _loss(out: Any) -> torch.Tensor:
    return out.features.sum() + out.summary.sum()


def measure(model: CPEViT, damp: DAMP | None, flops: bool) -> str:
    """One row: the second step's forward and backward operations (and forward FLOPs)."""
    images = torch.randn(2, 3, 256, 256)
    for _ in range(2):
        with spectral_step(model), damp.noise(model) if damp else nullcontext():
            forward, backward = forward_backward_counts(model, images, _loss)
    products = ", ".join(f"{n[6:]} {forward.by_name[n]}" for n in PRODUCTS if forward.by_name[n])
    row = f"forward {forward}, backward {backward}; forward products: {products}"
    if flops:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with spectral_step(model), damp.noise(model) if damp else nullcontext(), counter:
            model(images)
        row += f"; forward {counter.get_total_flops() / 1e9:.1f} GFLOP"
    return row


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if any(layout != "none" for layout in args.layouts):
        import torch.distributed as dist

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sock.getsockname()[1]))
        dist.init_process_group("gloo", rank=0, world_size=1)
    for layout in args.layouts:
        for damp in [None, DAMP(0.1)] if args.damp else [None]:
            model = student(args.width)
            if layout != "none":
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.fsdp import MixedPrecisionPolicy

                from radio_lit.students.sharding import FSDP2, shard_student

                mesh = init_device_mesh("cpu", (1,))
                shard_student(model, mesh, MixedPrecisionPolicy(), FSDP2(layout=layout))
            name = f"{layout}{' + DAMP' if damp else ''}"
            print(f"{name:>14}: {measure(model, damp, args.flops)}", flush=True)


if __name__ == "__main__":
    main()
