"""Packed variable-resolution forwards against one forward per resolution and padding.

Part 1, the stage-1 layout of ``configs/recipes/c-radio/stage1.yaml`` shrunk (each rank of 2:
``--low`` images at a low-res draw and ``--high`` at a high-res draw; the recipe's are 16 at
128-432 px and 2 at 512-1152 px on 64 GPUs), the student's forward and backward
(:class:`radio_lit.students.CPEViT`, random weights, training mode) timed as:

- ``partitioned``: the report's layout, one rank all low-res images, the other all high-res;
  the step is the slower rank's (its images/s count the step's images over 2 ranks);
- ``per-resolution``: each rank half of each partition, one forward per resolution;
- ``padded``: each rank's images in one forward, every image padded to the longest sequence
  (timm's NaFlex way: a key-padding mask);
- ``packed``: one forward over the concatenated tokens, attention block-diagonal per image
  (:mod:`radio_lit.students.packing`, kernel ``--kernel`` or the default choice).

Ratios are images/s (and tokens/s, real tokens only) over ``per-resolution``; the median of
``--rounds`` alternating rounds.

Part 2, the kernel crossover: block-diagonal attention alone (``q, k, v`` of ``--total``
tokens split into images of ``L`` tokens, forward and backward) per kernel and head dim, for
``L`` in ``--lengths``: on CUDA C-RADIOv4's head dims 80 (ViT-H/16) and 72 (SO400M), whose
tokens/s table is what ``model.student_packing.measured`` takes.

    python benchmarks/packing.py                                    # CPU sizes
    python benchmarks/packing.py --device cuda --dtype bfloat16 --model vit_huge_patch16_224 \
        --low 16 --high 2 --low-res 256 --high-res 768 --head-dims 80 72 --total 16384
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radio_lit.students import CPEViT  # noqa: E402
from radio_lit.students.attention_kernels import (  # noqa: E402
    available_kernels,
    block_attention,
    block_mask,
    choose_kernel,
)


def padded_forward(student: CPEViT, views: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every image's tokens padded to the longest, one batched forward with a key mask."""
    seqs = [t for v in views for t in student.embed(v)[0]]
    longest = max(s.shape[0] for s in seqs)
    x = torch.stack([F.pad(s, (0, 0, 0, longest - s.shape[0])) for s in seqs])
    lengths = torch.tensor([s.shape[0] for s in seqs], device=x.device)
    valid = torch.arange(longest, device=x.device)[None, :] < lengths[:, None]
    mask = valid[:, None, None, :]
    x = student.norm_pre(x)
    for block in student.blocks:
        x = block(x, attn_mask=mask)
    return [student.norm(x)[i, :n] for i, n in enumerate(lengths.tolist())]


def _timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    out = fn()
    loss = sum(o.float().square().mean() for o in out)
    loss.backward()
    sync()
    return time.perf_counter() - start


def layout_rows(args: argparse.Namespace, device: torch.device, sync) -> None:
    kwargs = {} if args.depth is None else dict(depth=args.depth)
    if args.width:
        kwargs.update(embed_dim=args.width, num_heads=args.width // args.head_dim)
    student = CPEViT(args.model, max_resolution=2048, num_registers=4, model_kwargs=kwargs)
    student = student.to(device, getattr(torch, args.dtype)).train()
    head_dim = student.blocks[0].attn.head_dim
    kernel = args.kernel or choose_kernel(device.type, head_dim)
    dtype = getattr(torch, args.dtype)

    def images(n: int, res: int) -> torch.Tensor:
        return torch.randn(n, 3, res, res, device=device, dtype=dtype)

    low, high = images(args.low, args.low_res), images(args.high, args.high_res)
    low2, high2 = images(2 * args.low, args.low_res), images(2 * args.high, args.high_res)
    prefix = student.num_cls_tokens + student.num_registers
    tokens = sum(
        n * (prefix + (r // 16) ** 2)
        for n, r in [(args.low, args.low_res), (args.high, args.high_res)]
    )

    def features(outs):
        return [o.features for o in outs]

    runs = {
        "partitioned": lambda: None,
        "per-resolution": lambda: features([student(low), student(high)]),
        "padded": lambda: padded_forward(student, [low, high]),
        f"packed ({kernel})": lambda: features(student([low, high], kernel)),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.warmup + args.rounds):
        slow = max(
            _timed(lambda: [student(low2).features], sync),
            _timed(lambda: [student(high2).features], sync),
        )
        times["partitioned"].append(slow)  # the slower rank sets the step
        for name, fn in list(runs.items())[1:]:
            times[name].append(_timed(fn, sync))
        student.zero_grad(set_to_none=True)
    images_per_rank = args.low + args.high
    print(
        f"stage-1 layout per rank: {args.low} x {args.low_res} px + {args.high} x "
        f"{args.high_res} px ({tokens} tokens), {args.model} head dim {head_dim}, "
        f"{device.type} {args.dtype}, forward+backward, median of {args.rounds}"
    )
    base = statistics.median(times["per-resolution"][args.warmup :])
    print(f"{'layout':<22}{'ms/step':>9}{'images/s':>10}{'tokens/s':>10}{'ratio':>7}")
    for name, values in times.items():
        t = statistics.median(values[args.warmup :])
        print(
            f"{name:<22}{t * 1e3:>9.1f}{images_per_rank / t:>10.1f}{tokens / t:>10.0f}"
            f"{base / t:>7.2f}"
        )


def crossover_rows(args: argparse.Namespace, device: torch.device, sync) -> None:
    dtype = getattr(torch, args.dtype)
    kernels = sorted(available_kernels(device.type))
    heads = args.heads
    print(f"\nkernel crossover: {args.total} tokens a sequence, {heads} heads, forward+backward")
    for head_dim in args.head_dims:
        for length in args.lengths:
            count = max(args.total // length, 1)
            lengths = [length] * count
            n = length * count
            row = {}
            for kernel in kernels:
                train = not (kernel == "flex" and device.type == "cpu")  # no CPU backward
                q, k, v = (
                    torch.randn(1, heads, n, head_dim, device=device, dtype=dtype).requires_grad_(
                        train
                    )
                    for _ in range(3)
                )
                mask = block_mask(lengths, device) if kernel == "sdpa_mask" else None
                values = []
                for _ in range(args.warmup + args.rounds):
                    sync()
                    start = time.perf_counter()
                    out = block_attention(q, k, v, lengths, kernel, mask)
                    if train:
                        out.float().sum().backward()
                    sync()
                    values.append(time.perf_counter() - start)
                row[kernel] = n / statistics.median(values[args.warmup :])
            best = max(row, key=row.get)
            cells = "  ".join(f"{k} {r / 1e3:8.1f}k" for k, r in row.items())
            print(f"head dim {head_dim:>3}  L {length:>5}  tokens/s: {cells}  best {best}")
    if device.type == "cpu":
        print("(flex: forward only on CPU, torch has no CPU backward for it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=0, help="embed dim (0: the model's)")
    parser.add_argument("--head-dim", type=int, default=64, help="with --width")
    parser.add_argument("--low", type=int, default=8)
    parser.add_argument("--high", type=int, default=1)
    parser.add_argument("--low-res", type=int, default=128)
    parser.add_argument("--high-res", type=int, default=256)
    parser.add_argument("--kernel", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64])
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--total", type=int, default=2048)
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    layout_rows(args, device, sync)
    crossover_rows(args, device, sync)


if __name__ == "__main__":
    main()
