"""FeatSharp against bilinear upsampling and plain tiling, on teachers whose truth is known,
trained as a user trains it: ``radio-lit fit --config configs/featsharp/quickstart.yaml``.

FeatSharp (arXiv 2502.16025, section 3) claims that an upsampler trained by multi-view
consistency on a frozen teacher's low-resolution pass and its ``k x k`` tile pass recovers the
teacher's high-resolution features better than bilinear upsampling of the low-resolution map or
the stitched tiles, and that its learned bias (3.3) removes the teacher's position-locked noise.
Real teachers have no known high-resolution truth; these do:

* **teacher** (:class:`FieldTeacher`, a radio_lit ``Teacher``): a fixed random convolutional
  encoder ``Phi`` (a ``p/k``-pixel patch embedding, a 3x3 convolution and a 1x1 one, GELUs
  between), optionally plus a **global-context term** ``G`` (a fixed random MLP of ``Phi``'s
  mean over the whole view, the same at every token: what a ViT's global attention adds and a
  tile, which sees only its part of the image, lacks), evaluated on its ``R``-pixel view at
  ``k`` times its token density gives the **truth** ``T = Phi(view) + G(view) [k h, k w, C]``;
  its output is that map average-pooled ``k x k`` to its ``h x w`` grid, times a position-locked
  **gain** (1 but for kind ``gain``), **plus a planted pattern** ``P [h, w, C]`` fixed per token
  position, zero-mean over the grid per channel (a constant offset is not position-locked and no
  method could tell it from the features' mean), scaled by the clean features' per-channel
  standard deviation: ``speckle`` (Gaussian, unit RMS), ``structured`` (SigLIP2-like
  low-activation borders and one **high-norm token**, 6x), ``few`` (three high-norm tokens, 6x,
  nothing elsewhere), ``registers`` (half-strength speckle, one column offset by 2x and two
  high-norm tokens, 5x), ``leakage`` (a positional embedding leaking in: two plane waves per
  channel over the grid, smooth, and two high-norm tokens, 4x), ``none``;
* **images**: ``dead-leaves`` (random discs, radii from a power law), ``shapes`` (rectangles,
  some filled with gratings) and ``sky`` (a sky gradient above a textured ground, an object near
  the centre: content whose mean depends on the position, as in photographs), a fresh set for
  training and a held-out set (other seeds);
* **kinds**, one teacher and image set each:

  | kind | context term | pattern | images |
  | --- | --- | --- | --- |
  | ``field`` | no | speckle | dead leaves |
  | ``context`` | yes | speckle | dead leaves |
  | ``structured`` | no | structured | dead leaves |
  | ``shapes`` (the base cell's) | yes | structured | rectangles and gratings |
  | ``few-tokens`` | no | few | dead leaves |
  | ``no-pattern`` | no | none | dead leaves |
  | ``gain`` (not additive) | no | a gain ``1 + 0.5 speckle`` per token and channel | dead leaves |
  | ``sky`` | yes | structured | sky |
  | ``registers`` (added after the sweep, tuned nothing) | yes | registers | sky |
  | ``leakage`` (added after the bias's curvature fix, tuned nothing) | yes | leakage | shapes |

* **training** (:func:`overlay`): ``radio-lit fit --config configs/featsharp/quickstart.yaml
  --config <overlay>``, the CLI's own ``main`` in a process of its own, where the overlay swaps
  only the teacher (:class:`FieldTeacher`, ``R = grid x 12`` px, patch 12), the images (a folder
  of ``TRAIN_IMAGES`` generated ones, the held-out folder as validation; the crop ``k R``), the
  upsampler's factor, ``max_steps`` and the seed, and for the pre-pass cells the pre-pass
  (``0``: ``bias_from_statistics: false``, the paper's zero start; the normalizer still from the
  config's pre-pass); everything else (rates, warm-up, pre-pass, views, callbacks, checkpoints)
  is the config's;
* **measures** (:func:`evaluate`), the run's ``last.ckpt`` loaded through
  :class:`~radio_lit.upsamplers.UpsampledTeacher` as a distillation config loads it, on the
  held-out images, in the teacher's space against ``T``:

  - *error to truth*: normalized MSE ``sum (X - T)^2 / sum (T - mean_c T)^2`` over images,
    tokens and channels (``mean_c``: each channel's mean over the held-out set; 0 is the
    truth, 1 is as far as the channel means), for ``X`` = bilinear upsampling of the
    low-resolution map (``align_corners=False``), the stitched tile pass, and FeatSharp's
    output;
  - *pattern removed*: the position-locked part of the output ``P = mean_images(low -
    avgpool_k(T))`` less its grid mean (the planted pattern exactly, for an additive one; for
    ``gain`` its additive part), in the normalized (PHI-S) space ``P_n = N(P) - N(0)``; with
    ``B_c`` the bias less its grid mean, ``removed = 1 - ||B_c + P_n|| / ||P_n||``: 100 % when
    ``B_c = -P_n``, 0 % for a zero bias, negative for a bias that adds noise (none without a
    pattern: its bias's RMS is reported);
  - a diagnostic: the trained upsampler with its bias replaced by ``-P_n``.

Commands:

    python benchmarks/featsharp.py cell --kind shapes --seed 0 --steps 600 --out r.jsonl
    python benchmarks/featsharp.py sweep --out benchmarks/results/featsharp-sweep.jsonl
    python benchmarks/featsharp.py table benchmarks/results/featsharp-sweep.jsonl

``cell`` trains and scores one cell and prints ``cell NAME: error to truth: bilinear B, tiles
T, featsharp F; pattern removed P%``; ``sweep`` runs the sweep's cells (:data:`SWEEP`), ``--jobs``
at a time, each in its own process with one thread, and prints the table; ``table`` prints it
from the results, last ``featsharp below bilinear and tiles on N of M cells; pattern removed >
50 % on N of M``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn
from torchvision.io import write_png

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from radio_lit.core.outputs import TeacherOutput  # noqa: E402
from radio_lit.data.views import as_float_images, resize_view  # noqa: E402
from radio_lit.teachers import Teacher  # noqa: E402
from radio_lit.upsamplers.passes import teacher_passes  # noqa: E402

CONFIG = harness.ROOT / "configs" / "featsharp" / "quickstart.yaml"
#: the held-out images' seeds start at HELD_OUT, the training images' at 0 (plus SEED_STRIDE
#: per benchmark seed)
HELD_OUT, SEED_STRIDE = 1_000_000, 10_000_000
#: training images per cell (the config's ``repeats: 8`` passes over them per epoch), held-out
#: images scored per cell [choice]
TRAIN_IMAGES, EVAL_IMAGES = 64, 32
#: the teacher's patch (px): a multiple of every factor swept (2, 3, 4)
PATCH = 12
#: a position-locked part below this RMS (normalized space) is no pattern
NO_PATTERN = 1e-3


def dead_leaves(seed: int, side: int, discs: int = 60) -> Tensor:
    """A ``[3, side, side]`` uint8 dead-leaves image: ``discs`` discs of random colours and
    centres, radii from ``side / 72`` to ``side / 4`` with density ``~ r^-3``, painted back to
    front over a random background [choice]."""
    generator = torch.Generator().manual_seed(seed)
    low, high = side / 72, side / 4
    u = torch.rand(discs, generator=generator)
    radii = (low**-2 - u * (low**-2 - high**-2)) ** -0.5
    centres = torch.rand(discs, 2, generator=generator) * side
    colours = torch.rand(discs + 1, 3, generator=generator)
    coords = torch.arange(side, dtype=torch.float32) + 0.5
    dy = coords[None, :, None] - centres[:, 0, None, None]
    dx = coords[None, None, :] - centres[:, 1, None, None]
    inside = dy.square() + dx.square() <= radii[:, None, None].square()  # [n, side, side]
    order = torch.arange(1, discs + 1)[:, None, None]
    top = (inside * order).amax(0)  # 0: background, else the last disc painted there
    return (colours[top].permute(2, 0, 1) * 255).round().to(torch.uint8)


def shapes(seed: int, side: int, count: int = 12) -> Tensor:
    """A ``[3, side, side]`` uint8 image of ``count`` axis-aligned rectangles (sides ``side / 16``
    to ``side / 2``) of random colours painted back to front over a random background, 40 % of
    them filled with a sinusoidal grating between two colours (random orientation, period
    ``side / 48`` to ``side / 8``) [choice]."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=generator)

    coords = torch.arange(side, dtype=torch.float32) + 0.5
    ys, xs = coords[:, None].expand(side, side), coords[None, :].expand(side, side)
    image = uniform(3, 1, 1).expand(3, side, side).clone()
    for _ in range(count):
        height, width = (side / 16 + uniform(2) * (side / 2 - side / 16)).tolist()
        top, left = (uniform(2) * torch.tensor([side - height, side - width])).tolist()
        inside = (ys >= top) & (ys < top + height) & (xs >= left) & (xs < left + width)
        colour = uniform(3, 1, 1)
        if float(uniform(1)) < 0.4:
            angle = float(uniform(1)) * torch.pi
            period = side / 48 + float(uniform(1)) * (side / 8 - side / 48)
            phase = xs * torch.cos(torch.tensor(angle)) + ys * torch.sin(torch.tensor(angle))
            wave = 0.5 + 0.5 * torch.sin(2 * torch.pi * phase / period + 2 * torch.pi * uniform(1))
            fill = colour * wave + uniform(3, 1, 1) * (1 - wave)
        else:
            fill = colour.expand(3, side, side)
        image = torch.where(inside, fill, image)
    return (image * 255).round().to(torch.uint8)


def sky(seed: int, side: int, discs: int = 12) -> Tensor:
    """A ``[3, side, side]`` uint8 image whose content's mean depends on the position, as in
    photographs: a bluish sky brightening towards a horizon at 40-60 % of the height, a ground
    of another colour with a horizontal texture below, ``discs`` small discs on the ground and
    one object (a disc of radius ``side / 8`` to ``side / 4``) near the centre [choice]."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=generator)

    coords = torch.arange(side, dtype=torch.float32) + 0.5
    ys, xs = coords[:, None].expand(side, side), coords[None, :].expand(side, side)
    horizon = side * (0.4 + 0.2 * float(uniform(1)))
    top = torch.tensor([0.2, 0.4, 0.7]) + 0.2 * uniform(3)
    low = torch.tensor([0.6, 0.75, 0.9]) + 0.1 * uniform(3)
    height = (ys / horizon).clamp(0, 1)
    image = top[:, None, None] * (1 - height) + low[:, None, None] * height
    ground = torch.tensor([0.35, 0.3, 0.15]) + 0.25 * uniform(3)
    period = side / 24 + float(uniform(1)) * side / 12
    texture = 0.85 + 0.15 * torch.sin(2 * torch.pi * ys / period + 3 * uniform(1))
    image = torch.where(ys >= horizon, ground[:, None, None] * texture, image)
    for _ in range(discs):
        centre = torch.stack([horizon + uniform(1) * (side - horizon), uniform(1) * side])
        radius = side / 48 + float(uniform(1)) * side / 16
        inside = (ys - centre[0]).square() + (xs - centre[1]).square() <= radius**2
        image = torch.where(inside, uniform(3, 1, 1), image)
    centre = side / 2 + (uniform(2) - 0.5) * side / 4
    radius = side / 8 + float(uniform(1)) * side / 8
    inside = (ys - centre[0]).square() + (xs - centre[1]).square() <= radius**2
    image = torch.where(inside, uniform(3, 1, 1), image)
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


#: the image generators by name (the kinds' images)
IMAGES = {"dead-leaves": dead_leaves, "shapes": shapes, "sky": sky}

#: each kind's teacher options and images (module docstring)
KINDS: dict[str, dict[str, object]] = {
    "field": {"context": 0.0, "pattern": "speckle", "images": "dead-leaves"},
    "context": {"context": 1.0, "pattern": "speckle", "images": "dead-leaves"},
    "structured": {"context": 0.0, "pattern": "structured", "images": "dead-leaves"},
    "shapes": {"context": 1.0, "pattern": "structured", "images": "shapes"},
    "few-tokens": {"context": 0.0, "pattern": "few", "images": "dead-leaves"},
    "no-pattern": {"context": 0.0, "pattern": "none", "images": "dead-leaves"},
    "gain": {"context": 0.0, "pattern": "gain", "images": "dead-leaves"},
    "sky": {"context": 1.0, "pattern": "structured", "images": "sky"},
    "registers": {"context": 1.0, "pattern": "registers", "images": "sky"},
    "leakage": {"context": 1.0, "pattern": "leakage", "images": "shapes"},
}


class FieldTeacher(Teacher):
    """A random convolutional teacher whose ``k``-times map is known (module docstring).

    Args:
        resolution: native resolution ``R`` (px).
        patch_size: ``p``, pixels per token of its ``h x w`` output grid.
        factor: ``k``; its truth has ``k`` times the tokens a side (``p`` a multiple of ``k``).
        dim: channels ``C``.
        strength: the planted pattern's scale relative to the clean features' per-channel
            std (``speckle``: its RMS; ``structured``: the borders' offset, the high-norm
            token 6x that; module docstring).
        seed: seed of the weights, the pattern and the calibration images.
        calibration_images: images the features' std is measured on.
        context: the global-context term's standard deviation (over images, per channel)
            relative to ``Phi``'s features'; 0: none.
        pattern: a name in :data:`PATTERNS` (module docstring); ``gain``: the speckle as a
            gain ``1 + 0.5 strength speckle`` on the pooled map instead of an offset.
        images: the calibration images' generator (:data:`IMAGES`).
    """

    def __init__(
        self,
        resolution: int = 48,
        patch_size: int = 12,
        factor: int = 3,
        dim: int = 32,
        strength: float = 1.0,
        seed: int = 0,
        calibration_images: int = 16,
        context: float = 0.0,
        pattern: str = "speckle",
        images: str = "dead-leaves",
    ) -> None:
        super().__init__(resolution, patch_size, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
        if patch_size % factor:
            raise ValueError(
                f"FieldTeacher: patch_size {patch_size} is not a multiple of factor {factor}"
            )
        self.factor, self.dim = factor, dim
        torch.manual_seed(seed)  # the global state is restored after __init__ (Teacher)
        stride = patch_size // factor
        self.model = nn.Sequential(
            nn.Conv2d(3, dim, stride, stride),
            nn.GELU(),
            nn.Conv2d(dim, dim, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(dim, dim, 1),
        )
        self.context = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.context_scale = 0.0
        draw = IMAGES[images]
        calibration = torch.stack(
            [draw(-1 - seed * 1000 - i, resolution) for i in range(calibration_images)]
        )
        with torch.no_grad():
            fine = self.model(self.view(as_float_images(calibration)))
            sigma = self.pooled(fine).reshape(-1, dim).std(0)
            if context > 0:  # G's spread over the images, per channel, to context x sigma
                spread = self.context(fine.mean((2, 3))).std(0).mean()
                self.context_scale = context * float(sigma.mean() / spread.clamp_min(1e-12))
        if pattern not in PATTERNS:
            raise ValueError(f"FieldTeacher: pattern is one of {sorted(PATTERNS)}, got {pattern!r}")
        planted = PATTERNS[pattern](self.grid_size, dim)
        gain = torch.ones(*self.grid_size, dim)
        if pattern == "gain":  # not additive: a position-locked gain, no offset
            gain, planted = gain + 0.5 * strength * planted, torch.zeros_like(planted)
        self.register_buffer("pattern", planted * sigma * strength, persistent=False)
        self.register_buffer("gain", gain, persistent=False)
        self.freeze()

    @property
    def feature_dim(self) -> int:
        return self.dim

    @property
    def summary_dim(self) -> None:
        return None

    def pooled(self, fine: Tensor) -> Tensor:
        """``Phi``'s map ``[B, C, k h, k w]`` -> ``[B, h, w, C]``, averaged ``k x k``."""
        return F.avg_pool2d(fine, self.factor).permute(0, 2, 3, 1)

    def fine(self, view: Tensor) -> Tensor:
        """A normalized ``R`` px view -> ``Phi(view) + G(view) [B, C, k h, k w]``."""
        fine = self.model(view)
        if self.context_scale:
            term = self.context(fine.mean((2, 3))) * self.context_scale
            fine = fine + term[:, :, None, None]
        return fine

    def encode(self, view: Tensor) -> TeacherOutput:
        """A normalized ``R`` px view -> ``gain * avgpool_k(Phi(view) + G(view)) + P``, no
        summary."""
        return TeacherOutput(None, self.pooled(self.fine(view)) * self.gain + self.pattern)

    @torch.no_grad()
    def truth(self, images: Tensor) -> Tensor:
        """``images [B, 3, S, S]`` -> the truth ``Phi(view) + G(view) [B, k h, k w, C]`` of the
        very ``R`` px view the low-resolution pass sees."""
        view = self.view(resize_view(as_float_images(images), self.resolution))
        return self.fine(view).permute(0, 2, 3, 1)


def speckle(grid: tuple[int, int], dim: int) -> Tensor:
    """``[h, w, C]`` Gaussian speckle, zero-mean and unit RMS over the grid per channel."""
    noise = torch.randn(*grid, dim)
    noise = noise - noise.mean((0, 1))
    return noise / noise.square().mean((0, 1)).sqrt()


def structured(grid: tuple[int, int], dim: int) -> Tensor:
    """``[h, w, C]``: a low-activation border (every border token offset by ``-u``, a random
    unit-RMS direction ``u``; the interior by a ramp from 0 to ``+u`` at the far corner) and one
    high-norm token, ``6 v`` (``v`` another unit-RMS direction) at row 1, column ``w - 2``;
    zero-mean over the grid per channel."""
    u, v = torch.randn(2, dim)
    u, v = u / u.square().mean().sqrt(), v / v.square().mean().sqrt()
    h, w = grid
    rows, cols = torch.arange(h)[:, None], torch.arange(w)[None, :]
    border = (rows == 0) | (rows == h - 1) | (cols == 0) | (cols == w - 1)
    ramp = (rows + cols).float() / max(h + w - 2, 1)
    pattern = torch.where(border[..., None], -u, ramp[..., None] * u)
    pattern[min(1, h - 1), max(w - 2, 0)] = 6 * v
    return pattern - pattern.mean((0, 1))


def few(grid: tuple[int, int], dim: int) -> Tensor:
    """``[h, w, C]``: three high-norm tokens (``6 v_i``, unit-RMS random directions) at rows
    ``0, h // 2, h - 1`` and columns ``w // 3, w - 1, 0``, nothing elsewhere; zero-mean over the
    grid per channel."""
    h, w = grid
    pattern = torch.zeros(h, w, dim)
    for (row, col), v in zip(
        [(0, w // 3), (h // 2, w - 1), (h - 1, 0)], torch.randn(3, dim), strict=True
    ):
        pattern[row, col] += 6 * v / v.square().mean().sqrt()
    return pattern - pattern.mean((0, 1))


def registers(grid: tuple[int, int], dim: int) -> Tensor:
    """``[h, w, C]``: half-strength speckle, column ``w // 4`` offset by ``2 u`` and two
    high-norm tokens ``5 v_i`` at ``(h - 2, 1)`` and ``(h // 2, w // 2)`` (unit-RMS random
    directions); zero-mean over the grid per channel [choice: the kind added after the
    sweep's fix, used to tune nothing]."""
    h, w = grid
    pattern = 0.5 * speckle(grid, dim)
    u, *tokens = torch.randn(3, dim)
    pattern[:, w // 4] += 2 * u / u.square().mean().sqrt()
    for (row, col), v in zip(
        [(max(h - 2, 0), min(1, w - 1)), (h // 2, w // 2)], tokens, strict=True
    ):
        pattern[row, col] += 5 * v / v.square().mean().sqrt()
    return pattern - pattern.mean((0, 1))


def leakage(grid: tuple[int, int], dim: int) -> Tensor:
    """``[h, w, C]``: a positional embedding leaking into the features, two plane waves per
    channel (one and two cycles over the grid, each a random direction and phase; unit RMS
    together), plus two high-norm tokens ``4 v_i`` at ``(h // 3, w - 1)`` and ``(h - 1, w // 2)``
    (unit-RMS random directions); zero-mean over the grid per channel [choice: the kind added
    after the bias's curvature fix, used to tune nothing]."""
    h, w = grid
    rows = (torch.arange(h, dtype=torch.float32) / h)[:, None, None]
    cols = (torch.arange(w, dtype=torch.float32) / w)[None, :, None]
    waves = torch.zeros(h, w, dim)
    for cycles in (1.0, 2.0):
        angle, phase = torch.rand(2, dim) * 2 * math.pi
        along = cols * torch.cos(angle) + rows * torch.sin(angle)
        waves += torch.cos(2 * math.pi * cycles * along + phase)
    waves = waves - waves.mean((0, 1))
    pattern = waves / waves.square().mean((0, 1)).sqrt().clamp_min(1e-6)
    for (row, col), v in zip([(h // 3, w - 1), (h - 1, w // 2)], torch.randn(2, dim), strict=True):
        pattern[row, col] += 4 * v / v.square().mean().sqrt()
    return pattern - pattern.mean((0, 1))


def no_pattern(grid: tuple[int, int], dim: int) -> Tensor:
    """``[h, w, C]`` zeros: a teacher without position-locked noise."""
    return torch.zeros(*grid, dim)


#: the planted patterns by name (``gain`` draws a speckle and applies it as a gain)
PATTERNS = {
    "speckle": speckle,
    "structured": structured,
    "few": few,
    "registers": registers,
    "leakage": leakage,
    "none": no_pattern,
    "gain": speckle,
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of the sweep: ``kind`` (:data:`KINDS`) on ``seed``, a ``grid x grid``
    teacher upsampled ``factor`` times, ``steps`` steps (a multiple of the config's checkpoint
    interval, 30), the pre-pass: ``None`` the config's, ``0`` a zero-started bias
    (``bias_from_statistics: false``), else ``statistics_batches``."""

    kind: str = "shapes"
    seed: int = 0
    grid: int = 4
    factor: int = 3
    steps: int = 600
    prepass: int | None = None

    @property
    def name(self) -> str:
        prepass = "config" if self.prepass is None else self.prepass
        return f"{self.kind}-s{self.seed}-g{self.grid}-k{self.factor}-n{self.steps}-p{prepass}"

    def teacher(self) -> dict[str, object]:
        """The :class:`FieldTeacher`'s ``init_args``."""
        return {
            "resolution": self.grid * PATCH,
            "patch_size": PATCH,
            "factor": self.factor,
            "seed": self.seed,
            **KINDS[self.kind],
        }

    @property
    def side(self) -> int:
        """The crop (px): ``k R``, as the quickstart's (the tile pass sees it 1:1)."""
        return self.factor * self.grid * PATCH


#: the robustness sweep: one setting varied at a time around the base cell (kind
#: ``shapes``, seed 0, 4x4 grid, factor 3, the config's pre-pass), the base on 2 seeds at 3,000
#: steps and at the short schedule that the others use [choice: 300 steps, checked against
#: 3,000 on the base cell; what a shared 2-core machine runs in an hour], then every kind and
#: the 8x8 and 24x24 grids from a zero start; ``registers`` and ``leakage`` from the config's
#: pre-pass are left out (each checks a fix, tuned nothing: run it with ``cell --kind leakage
#: --steps 3000``); a 24x24 cell takes half an hour or more on one thread (36 times the 4x4
#: tokens)
SHORT, LONG = 300, 3000
SWEEP = [
    Cell(steps=LONG),
    Cell(seed=1, steps=LONG),
    Cell(steps=SHORT),
    Cell(seed=1, steps=SHORT),
    Cell(prepass=0, steps=SHORT),
    *(Cell(kind=k, steps=SHORT) for k in ("few-tokens", "no-pattern", "gain", "sky")),
    *(Cell(kind=k, steps=SHORT) for k in ("field", "context", "structured")),
    Cell(grid=8, steps=SHORT),
    Cell(prepass=100, steps=SHORT),
    *(Cell(factor=k, steps=SHORT) for k in (2, 4)),
    *(Cell(kind=k, prepass=0, steps=SHORT) for k in KINDS if k != "shapes"),
    Cell(grid=24, steps=SHORT),
    Cell(grid=8, prepass=0, steps=SHORT),
    Cell(grid=24, prepass=0, steps=SHORT),
]


def write_images(folder: Path, kind: str, first: int, count: int, side: int) -> Path:
    """``count`` PNGs of ``side`` px from the generator ``kind`` (:data:`IMAGES`), image ``i``
    drawn from seed ``first + i``; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        write_png(IMAGES[kind](first + i, side), str(folder / f"{i:04d}.png"))
    return folder


def held_out(cell: Cell, count: int | None = None) -> Tensor:
    """The cell's held-out images ``[count, 3, k R, k R]`` uint8 (``None``: ``EVAL_IMAGES``)."""
    count = EVAL_IMAGES if count is None else count
    draw, first = IMAGES[str(KINDS[cell.kind]["images"])], HELD_OUT + cell.seed * SEED_STRIDE
    return torch.stack([draw(first + i, cell.side) for i in range(count)])


def overlay(cell: Cell, folder: Path) -> dict[str, object]:
    """The overlay on ``configs/featsharp/quickstart.yaml`` that trains ``cell`` (module
    docstring), its ``TRAIN_IMAGES`` training and held-out images written under ``folder``:
    only the teacher, the images and crop, the factor, ``max_steps``, the seed and (pre-pass
    cells) the pre-pass change."""
    images = str(KINDS[cell.kind]["images"])
    train = write_images(folder / "train", images, cell.seed * SEED_STRIDE, TRAIN_IMAGES, cell.side)
    held = folder / "held-out"
    held.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(held_out(cell)):
        write_png(image, str(held / f"{i:04d}.png"))
    model: dict[str, object] = {
        "teacher": {"class_path": "benchmarks.featsharp.FieldTeacher", "init_args": cell.teacher()},
        "upsampler": {"init_args": {"factor": cell.factor}},
    }
    if cell.prepass == 0:
        model["bias_from_statistics"] = False
    elif cell.prepass is not None:
        model["statistics_batches"] = cell.prepass
    return {
        "seed_everything": cell.seed,
        "trainer": {"max_steps": cell.steps},
        "model": {"init_args": model},
        "data": {
            "init_args": {"train_dir": str(train), "val_dir": str(held), "crop_size": cell.side}
        },
    }


def train(cell: Cell, folder: Path) -> tuple[Path, float]:
    """``radio-lit fit --config configs/featsharp/quickstart.yaml --config <overlay>`` in
    ``folder`` (its run folder under ``folder/lightning_logs``); returns the run's ``last.ckpt``
    and the seconds the command took."""
    from radio_lit.cli.app import main as radio_lit

    path = folder / "overlay.yaml"
    path.write_text(yaml.safe_dump(overlay(cell, folder)), encoding="utf-8")
    here = Path.cwd()
    os.chdir(folder)
    start = time.perf_counter()
    try:
        radio_lit(["fit", "--config", str(CONFIG), "--config", str(path)])
    finally:
        os.chdir(here)
    seconds = time.perf_counter() - start
    (checkpoint,) = folder.glob("lightning_logs/*/*/checkpoints/last.ckpt")
    return checkpoint, seconds


def upsampled_teacher(cell: Cell, checkpoint: Path) -> nn.Module:
    """The run's checkpoint through :class:`~radio_lit.upsamplers.UpsampledTeacher`, its
    ``upsampler`` entry the config's with the cell's factor, built by jsonargparse as a
    distillation config builds it."""
    from jsonargparse import ArgumentParser

    from radio_lit.upsamplers import UpsampledTeacher

    upsampler = copy.deepcopy(harness.load_config(CONFIG)["model"]["init_args"]["upsampler"])
    upsampler["init_args"]["factor"] = cell.factor
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(UpsampledTeacher, "upsampled")
    entry = {
        "teacher": {"class_path": "benchmarks.featsharp.FieldTeacher", "init_args": cell.teacher()},
        "upsampler": upsampler,
        "checkpoint": str(checkpoint),
    }
    return parser.instantiate_classes(parser.parse_object({"upsampled": entry})).upsampled


def normalized_mse(prediction: Tensor, truth: Tensor) -> float:
    """``sum (X - T)^2 / sum (T - mean_c T)^2`` over ``[N, H, W, C]`` (module docstring)."""
    spread = (truth - truth.mean((0, 1, 2))).square().sum()
    return ((prediction - truth).square().sum() / spread).item()


def pattern_removed(upsampler: nn.Module, locked: Tensor) -> dict[str, float]:
    """``removed = 1 - ||B_c + P_n|| / ||P_n||`` (module docstring) for the position-locked
    part ``locked [h, w, C]`` (teacher space), with the RMS of ``B_c`` and ``P_n`` and the
    cosine of ``-B_c`` and ``P_n``; ``removed`` and the cosine are NaN without a pattern (RMS
    below ``NO_PATTERN``: the mean over held-out images of ``low - avgpool_k(T)`` is then
    rounding noise)."""
    bias = upsampler.bias.pattern(tuple(locked.shape[:2]))
    bias = bias - bias.mean((0, 1))
    pattern = normalized_pattern(upsampler, locked)
    size, rms = pattern.norm(), pattern.square().mean().sqrt().item()
    nan, patterned = float("nan"), rms >= NO_PATTERN
    return {
        "removed": 100 * (1 - (bias + pattern).norm() / size).item() if patterned else nan,
        "bias_rms": bias.square().mean().sqrt().item(),
        "pattern_rms": rms,
        "cosine": (-(bias * pattern).sum() / (bias.norm() * size)).item()
        if patterned and bias.norm() > 1e-12
        else nan,
    }


def normalized_pattern(upsampler: nn.Module, locked: Tensor) -> Tensor:
    """``P_n = N(P) - N(0)`` less its grid mean ``[h, w, C]``: the pattern in the normalized
    space."""
    normalizer = upsampler.normalizer
    pattern = normalizer(locked) - normalizer(torch.zeros_like(locked))
    return pattern - pattern.mean((0, 1))


@torch.no_grad()
def evaluate(upsampled: nn.Module, images: Tensor, batch: int = 8) -> dict[str, float]:
    """Errors to the truth over ``images`` of bilinear, tiles, FeatSharp (``upsampled``, an
    :class:`~radio_lit.upsamplers.UpsampledTeacher`) and the diagnostic ``exact bias``, and the
    pattern removed (module docstring)."""
    teacher, factor = upsampled.teacher, upsampled.factor
    names = ("truth", "low", "bilinear", "tiles", "featsharp")
    outputs: dict[str, list[Tensor]] = {k: [] for k in names}
    for chunk in images.split(batch):
        floats = as_float_images(chunk)
        passes = teacher_passes(teacher, floats, factor)
        low = passes.low.permute(0, 3, 1, 2)
        size = (low.shape[-2] * factor, low.shape[-1] * factor)
        outputs["truth"].append(teacher.truth(chunk))
        outputs["low"].append(passes.low)
        outputs["bilinear"].append(
            F.interpolate(low, size=size, mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
        )
        outputs["tiles"].append(passes.tiles)
        outputs["featsharp"].append(upsampled(floats).features)
    joined = {k: torch.cat(v) for k, v in outputs.items()}
    truth = joined.pop("truth")
    pooled = F.avg_pool2d(truth.permute(0, 3, 1, 2), factor).permute(0, 2, 3, 1)
    locked = (joined.pop("low") - pooled).mean(0)
    locked = locked - locked.mean((0, 1))
    result = {k: normalized_mse(v, truth) for k, v in joined.items()}
    exact = copy.deepcopy(upsampled.upsampler)
    exact.bias.bias.copy_(-normalized_pattern(exact, locked).permute(2, 0, 1))
    fixed = [exact.upsample(teacher, as_float_images(c)).features for c in images.split(batch)]
    result["exact bias"] = normalized_mse(torch.cat(fixed), truth)
    result.update(pattern_removed(upsampled.upsampler, locked))
    return result


def run_cell(cell: Cell, out: Path | None = None) -> dict[str, object]:
    """Train and score ``cell`` in a temporary folder; print its line, append its result as
    one JSON line to ``out``."""
    with tempfile.TemporaryDirectory(prefix=f"featsharp-{cell.name}-") as folder:
        checkpoint, seconds = train(cell, Path(folder))
        harness.quiet()
        step = torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"]
        if step != cell.steps:
            raise RuntimeError(f"{checkpoint} is at step {step}, not {cell.steps}")
        result = evaluate(upsampled_teacher(cell, checkpoint), held_out(cell))
    record = {**dataclasses.asdict(cell), "name": cell.name, "seconds": seconds, **result}
    print(line(record), flush=True)
    if out is not None:
        with open(out, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
    return record


def line(record: dict[str, object]) -> str:
    """``cell NAME: error to truth: bilinear B, tiles T, featsharp F; pattern removed P%``."""
    return (
        f"cell {record['name']}: error to truth: bilinear {record['bilinear']:.4f}, tiles "
        f"{record['tiles']:.4f}, featsharp {record['featsharp']:.4f}; pattern removed "
        f"{record['removed']:.1f}%"
    )


def wins(record: dict[str, object]) -> bool:
    """FeatSharp below bilinear and the tiles, and > 50 % of a pattern removed."""
    below = record["featsharp"] < min(record["bilinear"], record["tiles"])
    return bool(below and (not patterned(record) or record["removed"] > 50))


def patterned(record: dict[str, object]) -> bool:
    """Whether the cell's teacher has a position-locked part (RMS at least ``NO_PATTERN``)."""
    return record["pattern_rms"] >= NO_PATTERN


def table(records: list[dict[str, object]]) -> str:
    """The sweep's markdown table (one row per cell, in order) and its summary line."""
    rows = [
        "| cell | kind | seed | grid | factor | steps | pre-pass | bilinear | tiles | "
        "featsharp | / bilinear | exact bias | pattern removed | bias RMS / pattern's | s |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | "
        "---: | --- | ---: |",
    ]
    for r in records:
        prepass = (
            "config (10)"
            if r["prepass"] is None
            else ("0 (zero start)" if r["prepass"] == 0 else str(r["prepass"]))
        )
        removed = f"{r['removed']:.1f} %" if patterned(r) else "—"
        rows.append(
            f"| {'win' if wins(r) else '**loses**'} | {r['kind']} | {r['seed']} | "
            f"{r['grid']}x{r['grid']} | {r['factor']} | {r['steps']} | {prepass} | "
            f"{r['bilinear']:.3f} | {r['tiles']:.3f} | {r['featsharp']:.3f} | "
            f"{r['featsharp'] / r['bilinear']:.2f} | {r['exact bias']:.3f} | {removed} | "
            f"{r['bias_rms']:.2f} / {r['pattern_rms']:.2f} | {r['seconds']:.0f} |"
        )
    below = sum(r["featsharp"] < min(r["bilinear"], r["tiles"]) for r in records)
    with_pattern = [r for r in records if patterned(r)]
    removed = sum(r["removed"] > 50 for r in with_pattern)
    rows.append(
        f"featsharp below bilinear and tiles on {below} of {len(records)} cells; "
        f"pattern removed > 50 % on {removed} of {len(with_pattern)}"
    )
    return "\n".join(rows)


def read(path: Path) -> list[dict[str, object]]:
    """The records of a results file, one JSON line each."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(text) for text in lines if text.strip()]


def sweep(cells: list[Cell], out: Path, jobs: int) -> list[dict[str, object]]:
    """Run ``cells`` not yet started (no log ``<out>.<cell>.log``: delete it to run the cell
    again), ``jobs`` processes at a time with one thread each (``cell`` subcommands); returns
    every record of ``out``."""
    queue = list(cells)
    running: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    while queue or running:
        while queue and len(running) < jobs:
            cell = queue.pop(0)
            if out.with_suffix(f".{cell.name}.log").exists():
                continue  # started by this sweep or another
            flags = [
                f"--{f.name}={getattr(cell, f.name)}"
                for f in dataclasses.fields(cell)
                if getattr(cell, f.name) is not None
            ]
            command = [sys.executable, __file__, "cell", *flags, f"--out={out}"]
            log = open(out.with_suffix(f".{cell.name}.log"), "wb")  # noqa: SIM115
            running.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(5)
        running = [p for p in running if p.poll() is None]
    return read(out)


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("cell", help="train and score one cell")
    for field in dataclasses.fields(Cell):
        kind = str if field.name == "kind" else int
        one.add_argument(f"--{field.name}", type=kind, default=field.default)
    one.add_argument("--out", type=Path, help="append the result as a JSON line here")
    many = commands.add_parser("sweep", help="run the sweep's cells (SWEEP) not yet in --out")
    many.add_argument("--out", type=Path, required=True)
    many.add_argument("--jobs", type=int, default=2, help="cells at a time (one thread each)")
    shown = commands.add_parser("table", help="the table of a results file")
    shown.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    if args.command == "cell":
        torch.set_num_threads(1)
        fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(Cell)}
        return [run_cell(Cell(**fields), args.out)]
    records = sweep(SWEEP, args.out, args.jobs) if args.command == "sweep" else read(args.results)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
