"""The CPE student's training windows of its position-embedding grid (AM-RADIO 4, "CPE"),
forward and backward: radio-lit's one sampling of the grid for the whole batch against the
plain ``grid_sample`` of the grid expanded to one copy a sample, whose backward writes a dense
gradient of every copy and sums it. Same windows, same coordinates, one process, alternating.

Per side: the median seconds of ``--repeats`` forward+backward passes and the largest block
the allocator handed out during one (``torch.profiler``'s memory events; on CUDA
``max_memory_allocated`` above the start).

    python benchmarks/cpe_windows.py                          # ViT-B, 1024 px grid, batch 16
    python benchmarks/cpe_windows.py --dim 1280 --grid 128 --batch 32 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radio_lit.students import CPEViT  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=768, help="embedding width D")
    parser.add_argument("--grid", type=int, default=64, help="the grid's side G (max px / 16)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24, help="a window's side (384 px / 16)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


#: ``torch.nn.functional.grid_sample`` itself (the benchmark replaces it while it measures).
GRID_SAMPLE = F.grid_sample


def expanded(grid: torch.Tensor, coords: torch.Tensor, batch: int, **kwargs) -> torch.Tensor:
    """The plain baseline: the grid expanded to ``batch`` copies, each sampled at its own
    window's coordinates (``coords [1, B h, w, 2]``, as radio-lit stacks them)."""
    per_sample = coords.reshape(batch, -1, coords.shape[2], 2)
    return GRID_SAMPLE(grid.expand(batch, -1, -1, -1), per_sample, **kwargs)


def measure(student: CPEViT, args: argparse.Namespace, plain: bool) -> tuple[float, int]:
    """Median seconds of a forward+backward of the windows, and the largest block (bytes)."""
    device = torch.device(args.device)

    def sample(grid, coords, **kwargs):
        return (
            expanded(grid, coords, args.batch, **kwargs)
            if plain
            else GRID_SAMPLE(grid, coords, **kwargs)
        )

    F.grid_sample = sample
    try:

        def step() -> None:
            windows = student.position_embeddings(args.batch, (args.tokens, args.tokens))
            windows.sum().backward()
            student.pos_embed.grad = None

        step()
        seconds = []
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - start)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            step()
            largest = torch.cuda.max_memory_allocated(device) - before
        else:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
            largest = max((e.cpu_memory_usage for e in prof.events()), default=0)
    finally:
        F.grid_sample = GRID_SAMPLE
    return statistics.median(seconds), largest


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    student = (
        CPEViT(
            model="vit_tiny_patch16_224",
            max_resolution=16 * args.grid,
            model_kwargs={"depth": 1, "embed_dim": args.dim, "num_heads": 1},
        )
        .to(args.device)
        .train()
    )
    torch.manual_seed(0)
    lit_s, lit_b = measure(student, args, plain=False)
    plain_s, plain_b = measure(student, args, plain=True)
    print(
        f"D {args.dim}, grid {args.grid}x{args.grid}, batch {args.batch}, windows "
        f"{args.tokens}x{args.tokens}, {args.device}: radio-lit {lit_s * 1e3:.2f} ms, "
        f"{lit_b / 2**20:.1f} MiB largest; plain {plain_s * 1e3:.2f} ms, "
        f"{plain_b / 2**20:.1f} MiB; time ratio {lit_s / plain_s:.3f}"
    )


if __name__ == "__main__":
    main()
