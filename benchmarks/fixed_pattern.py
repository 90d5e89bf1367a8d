"""Does the shift-equivariant dense loss keep a teacher's fixed-pattern noise out of the student?

C-RADIOv4 report 2.3: plain MSE teaches the student the teacher's position-locked noise
(SigLIP2's border holes, SAM's window borders, DINOv3's speckles); shifting every view by
whole patches makes the pattern unpredictable from the student's input. A toy that isolates the
claim, with radio-lit's own geometry (:mod:`radio_lit.geometry.shifts`: ``shifted_view``,
``to_crop_frame``, ``masked_loss``, ``PatchShifts``):

* images: random smooth RGB images, 96 px (a sum of random low-frequency waves): a 64 px shared
  region with a 16 px margin (two patches) that each view's own shifted crop moves into;
* teacher: a fixed random linear map of each 8 px patch's pixels (shift-equivariant content,
  16 channels) **plus** a fixed random pattern ``P [8, 8, 16]`` added at each token position
  of the teacher's own view (unit energy per token, like the content's);
* student: 8 px patches -> linear -> + a learned position embedding -> GELU MLP -> 16
  channels, i.e. able to reproduce a position-locked pattern if the loss asks for it;
* rows: plain MSE (no shifts), the recipe's shifts (``round(N(0, 0.5))`` tokens per axis for
  student and teacher, RADIO #181), wider shifts (uniform ±2 tokens);
* metrics on unshifted test images: the student's MSE against the *clean* teacher features
  (content only), and the share of the pattern it reproduces: ``<R, P> / <P, P>`` with ``R``
  the mean over test images of (prediction - clean features) per token (1: the whole
  pattern copied, 0: none).

    python benchmarks/fixed_pattern.py                 # 3 seeds x 3 rows, ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.geometry.shifts import PatchShifts, masked_loss, shifted_view, to_crop_frame
from radio_lit.losses import MSE

PATCH, SIDE, DIM = 8, 64, 16
GRID = SIDE // PATCH
MARGIN = 2 * PATCH / SIDE  # a fraction of the region's side on each side: two patches


def images(count: int, generator: torch.Generator) -> Tensor:
    """``[count, 3, 96, 96]`` smooth random images in ``[0, 1]``: the 64 px region and its
    16 px margin."""
    side = int(SIDE * (1 + 2 * MARGIN))
    coords = torch.linspace(0, side / SIDE, side)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")
    out = torch.zeros(count, 3, side, side)
    for _ in range(6):
        freq = torch.rand(count, 3, 2, generator=generator) * 6
        phase = torch.rand(count, 3, 1, 1, generator=generator) * 2 * math.pi
        wave = torch.sin(
            2 * math.pi * (freq[..., 0, None, None] * rows + freq[..., 1, None, None] * cols)
            + phase
        )
        out += wave / 6
    return (out + 1) / 2


def tokens(view: Tensor) -> Tensor:
    """``[n, 3, 64, 64]`` -> ``[n, 8, 8, 3 * 8 * 8]`` patches."""
    return F.unfold(view, PATCH, stride=PATCH).transpose(1, 2).reshape(-1, GRID, GRID, 192)


class Teacher:
    """Fixed random content map plus a fixed pattern locked to its own token positions."""

    def __init__(self, generator: torch.Generator) -> None:
        self.weight = torch.randn(192, DIM, generator=generator) / math.sqrt(192) * 4
        pattern = torch.randn(GRID, GRID, DIM, generator=generator)
        self.pattern = pattern / pattern.square().mean().sqrt()

    def clean(self, view: Tensor) -> Tensor:
        return tokens(view - 0.5) @ self.weight

    def __call__(self, view: Tensor) -> Tensor:
        return self.clean(view) + self.pattern


class Student(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(192, 64)
        self.position = nn.Parameter(torch.zeros(GRID, GRID, 64))
        self.mlp = nn.Sequential(nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, DIM))

    def forward(self, view: Tensor) -> Tensor:
        return self.mlp(self.embed(tokens(view - 0.5)) + self.position)


def train(shifts: PatchShifts | None, seed: int, steps: int, batch: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(seed)
    teacher = Teacher(generator)
    torch.manual_seed(seed)
    student = Student()
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(steps):
        crop = images(batch, generator)
        if shifts is None:
            region = shifted_view(crop, (SIDE, SIDE), MARGIN)
            loss = F.mse_loss(student(region), teacher(region))
        else:
            k_s, k_t = shifts.draw(batch), shifts.draw(batch)
            student_view = shifted_view(crop, (SIDE, SIDE), MARGIN, k_s, PATCH)
            teacher_view = shifted_view(crop, (SIDE, SIDE), MARGIN, k_t, PATCH)
            pred, seen_s = to_crop_frame(student(student_view), k_s)
            target, seen_t = to_crop_frame(teacher(teacher_view), k_t)
            loss = masked_loss(MSE(), pred, target, seen_s & seen_t, False)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test = shifted_view(
        images(256, torch.Generator().manual_seed(10_000 + seed)), (SIDE, SIDE), MARGIN
    )
    with torch.no_grad():
        pred, clean = student(test), teacher.clean(test)
    residual = (pred - clean).mean(0)
    copied = (residual * teacher.pattern).sum() / teacher.pattern.square().sum()
    return {"clean_mse": F.mse_loss(pred, clean).item(), "pattern_copied": copied.item()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = {
        "plain MSE": None,
        "shifts N(0, 0.5)": PatchShifts(),
        "shifts uniform ±2": PatchShifts("uniform", max_shift=2),
    }
    print("| row | MSE vs clean teacher | pattern copied | seeds |")
    print("|---|---|---|---|")
    for name, shifts in rows.items():
        runs = [train(shifts, seed, args.steps, args.batch) for seed in args.seeds]
        cells = []
        for key in ("clean_mse", "pattern_copied"):
            values = [run[key] for run in runs]
            cells.append(f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}")
        print(f"| {name} | {cells[0]} | {cells[1]} | {', '.join(map(str, args.seeds))} |")


if __name__ == "__main__":
    main()
