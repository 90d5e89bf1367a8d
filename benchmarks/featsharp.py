"""FeatSharp against bilinear upsampling and plain tiling, on teachers whose truth is known.

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
  its output is that map average-pooled ``k x k`` to its ``h x w`` grid **plus a planted
  pattern** ``P [h, w, C]`` fixed per token position, the same for every image, zero-mean over
  the grid per channel (a constant offset is not position-locked and no method could tell it
  from the features' mean): ``speckle`` (as ``FixedPatternTeacher``'s, RMS ``strength`` times
  the clean features' per-channel standard deviation) or ``structured`` (SigLIP2-like
  low-activation borders along one direction plus one **high-norm token**, 6x the features'
  standard deviation per channel, at a fixed interior position). So the low-resolution output is
  exactly ``avgpool_k(T) + P``; its tile pass sees each tile of the ``k R``-pixel image at ``R``
  pixels (a 3x zoom: not ``T``, but close where there is no ``G``) plus ``P`` per tile;
* **images**: ``dead-leaves`` (random discs with random colours, radii from a power law,
  painted back to front) or ``shapes`` (rectangles, some filled with sinusoidal gratings of
  random orientation and period), a fresh set for training and a held-out set (other seeds);
* **kinds** (``--kinds``), one teacher and image set each:

  | kind | context term | pattern | images |
  | --- | --- | --- | --- |
  | ``field`` (this benchmark's own) | no | speckle | dead leaves |
  | ``context`` | yes | speckle | dead leaves |
  | ``structured`` | no | structured + high-norm token | dead leaves |
  | ``shapes`` | yes | structured + high-norm token | rectangles and gratings |

  each on ``--seeds`` (the teacher's weights and pattern, the training images and
  ``seed_everything``);
* **training**: ``configs/featsharp/quickstart.yaml`` built by radio-lit's own CLI
  (``benchmarks.harness.build``: its ``FeatSharpModule``, upsampler, views, optimizer, schedule,
  gradient clipping, normalizer pre-pass and random-state callbacks) with its teacher replaced
  by :class:`FieldTeacher`, its steps by ``--steps`` and its pre-pass by
  ``--statistics-batches``, fitted by its Trainer on the images (logger, checkpoints and PCA
  panels off), over the paper's schedule: 3,000 steps of 4 images with a 100-step warm-up
  [notes 4.4] (``--steps``, ``--warmup``) at the config's rates (``--bias-lr-scale`` scales the
  bias's);
* **measures**, on the held-out images, in the teacher's space against ``T``:

  - *error to truth*: normalized MSE ``sum (X - T)^2 / sum (T - mean_c T)^2`` over images,
    tokens and channels (``mean_c``: each channel's mean over the held-out set; 0 is the
    truth, 1 is as far as the channel means), for ``X`` = bilinear upsampling of the
    low-resolution map (``align_corners=False``), the stitched tile pass, and FeatSharp's
    output (``FeatSharp.upsample``, denormalized);
  - *pattern removed*: the bias ``B [h, w, C]`` lives in the teacher's normalized (PHI-S)
    space, where the pattern is ``P_n = N(P) - N(0)`` (the normalizer's linear part); with
    ``B_c`` the bias less its mean over the grid (the constant part is free: it cancels in the
    objective), ``removed = 1 - ||B_c + P_n|| / ||P_n||`` (Frobenius norms over the grid and
    channels): 100 % when ``B_c = -P_n``, 0 % for a zero bias, negative for a bias that adds
    noise.
  - diagnostic rows: the trained upsampler with its bias replaced by ``-P_n`` (the pattern
    fully removed: the bias's share of FeatSharp's error) and by zero.

Prints a table per run and one line per run, ``kind K, seed S: error to truth: bilinear B,
tiles T, featsharp F; pattern removed P%``, then the mean per kind and last ``featsharp below
bilinear and tiles on N of M runs; pattern removed > 50 % on N of M``.

    python benchmarks/featsharp.py                    # 4 kinds x 2 seeds x 3,000 steps
    python benchmarks/featsharp.py --kinds field --seeds 0 --steps 20 --eval-images 8  # smoke
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from radio_lit.core.outputs import TeacherOutput  # noqa: E402
from radio_lit.data.views import as_float_images, resize_view  # noqa: E402
from radio_lit.teachers import Teacher  # noqa: E402
from radio_lit.upsamplers.module import LR_SCALES  # noqa: E402
from radio_lit.upsamplers.passes import teacher_passes  # noqa: E402

CONFIG = harness.ROOT / "configs" / "featsharp" / "quickstart.yaml"
#: the held-out images' seeds start at HELD_OUT, the training images' at 0 (plus SEED_STRIDE
#: per benchmark seed)
HELD_OUT, SEED_STRIDE = 1_000_000, 10_000_000


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


#: the image generators by name (``--kinds``' images)
IMAGES = {"dead-leaves": dead_leaves, "shapes": shapes}

#: each kind's teacher options and images (module docstring)
KINDS: dict[str, dict[str, object]] = {
    "field": {"context": 0.0, "pattern": "speckle", "images": "dead-leaves"},
    "context": {"context": 1.0, "pattern": "speckle", "images": "dead-leaves"},
    "structured": {"context": 0.0, "pattern": "structured", "images": "dead-leaves"},
    "shapes": {"context": 1.0, "pattern": "structured", "images": "shapes"},
}


class Images(Dataset):
    """``count`` images of ``side`` px from the generator ``kind`` (:data:`IMAGES`), image ``i``
    drawn from seed ``first + i``."""

    def __init__(self, count: int, side: int, first: int = 0, kind: str = "dead-leaves") -> None:
        self.count, self.side, self.first, self.draw = count, side, first, IMAGES[kind]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Tensor:
        return self.draw(self.first + index, self.side)


class FieldTeacher(Teacher):
    """A random convolutional teacher whose ``k``-times map is known (module docstring).

    Args:
        resolution: native resolution ``R`` (px).
        patch_size: ``p``, pixels per token of its ``h x w`` output grid.
        factor: ``k``; its truth has ``k`` times the tokens a side (``p`` a multiple of ``k``).
        dim: channels ``C``.
        strength: the planted pattern's scale relative to the clean features' per-channel
            std (``speckle``: its RMS; ``structured``: the borders' offset, the high-norm
            token 6x that).
        seed: seed of the weights, the pattern and the calibration images.
        calibration_images: images the features' std is measured on.
        context: the global-context term's standard deviation (over images, per channel)
            relative to ``Phi``'s features'; 0: none.
        pattern: ``speckle`` or ``structured`` (module docstring).
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
        if pattern not in ("speckle", "structured"):
            raise ValueError(f"FieldTeacher: pattern is speckle or structured, got {pattern!r}")
        planted = (speckle if pattern == "speckle" else structured)(self.grid_size, dim)
        self.register_buffer("pattern", planted * sigma * strength, persistent=False)
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
        """A normalized ``R`` px view -> ``avgpool_k(Phi(view) + G(view)) + P``, no summary."""
        return TeacherOutput(None, self.pooled(self.fine(view)) + self.pattern)

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


def build(
    steps: int,
    batch: int,
    teacher: dict[str, object],
    lr_scales: dict[str, float],
    warmup: int,
    seed: int = 0,
    statistics_batches: int = 100,
    bias_from_statistics: bool | None = None,
) -> object:
    """The quickstart's ``RadioLitCLI`` with :class:`FieldTeacher` as its teacher, ``steps``
    steps of which ``warmup`` warm up, seeded with ``seed``, its normalizer from a pre-pass
    of ``statistics_batches``, ``bias_from_statistics`` given (``None``: the module's
    default), no logger, checkpoints or PCA panels."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from radio_lit.evaluation import UpsamplerImages

    config = harness.load_config(CONFIG)
    config["model"]["init_args"]["teacher"] = {
        "class_path": "benchmarks.featsharp.FieldTeacher",
        "init_args": teacher,
    }
    config["model"]["init_args"]["warmup_steps"] = warmup
    config["model"]["init_args"]["statistics_batches"] = statistics_batches
    config["seed_everything"] = seed
    if bias_from_statistics is not None:
        config["model"]["init_args"]["bias_from_statistics"] = bias_from_statistics
    if lr_scales:
        config["model"]["init_args"]["lr_scales"] = lr_scales
    config["trainer"].pop("logger", None)
    path = Path(tempfile.mkdtemp(prefix="radio_lit_featsharp_")) / "featsharp.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    cli = harness.build(
        path,
        ["--trainer.logger=false", "--trainer.val_check_interval=null"],
        max_steps=steps,
    )
    callbacks = cli.trainer.callbacks
    callbacks[:] = [c for c in callbacks if not isinstance(c, (ModelCheckpoint, UpsamplerImages))]
    return cli


def normalized_mse(prediction: Tensor, truth: Tensor) -> float:
    """``sum (X - T)^2 / sum (T - mean_c T)^2`` over ``[N, H, W, C]`` (module docstring)."""
    spread = (truth - truth.mean((0, 1, 2))).square().sum()
    return ((prediction - truth).square().sum() / spread).item()


def pattern_removed(module: object, teacher: FieldTeacher) -> dict[str, float]:
    """``removed = 1 - ||B_c + P_n|| / ||P_n||`` in the normalized space (module docstring),
    with the RMS of ``B_c`` and ``P_n`` and the cosine of ``-B_c`` and ``P_n``."""
    upsampler = module.upsampler
    bias = upsampler.bias.pattern(teacher.grid_size)
    bias = bias - bias.mean((0, 1))
    normalizer = upsampler.normalizer
    pattern = normalizer(teacher.pattern) - normalizer(torch.zeros_like(teacher.pattern))
    return {
        "removed": 100 * (1 - (bias + pattern).norm() / pattern.norm()).item(),
        "bias_rms": bias.square().mean().sqrt().item(),
        "pattern_rms": pattern.square().mean().sqrt().item(),
        "cosine": (
            -(bias * pattern).sum() / (bias.norm() * pattern.norm()).clamp_min(1e-12)
        ).item(),
    }


def exact_bias(upsampler: nn.Module, teacher: FieldTeacher, zero: bool = False) -> nn.Module:
    """A copy of ``upsampler`` whose bias is the planted pattern's exact negative ``-P_n`` (a
    diagnostic: what the trained upsampler scores once the pattern is fully removed), or zero
    with ``zero``."""
    exact = copy.deepcopy(upsampler)
    normalizer = exact.normalizer
    pattern = normalizer(teacher.pattern) - normalizer(torch.zeros_like(teacher.pattern))
    with torch.no_grad():
        exact.bias.bias.copy_(
            torch.zeros_like(exact.bias.bias) if zero else -pattern.permute(2, 0, 1)
        )
    return exact


@torch.no_grad()
def errors(
    module: object, others: dict[str, nn.Module], images: Tensor, batch: int
) -> dict[str, float]:
    """Normalized MSE to the truth over ``images`` of bilinear, tiles, the module's FeatSharp
    and the ``others`` upsamplers by name (module docstring)."""
    teacher, upsampler, factor = module.teacher, module.upsampler, module.factor
    for each in (upsampler, *others.values()):
        each.eval()
    names = ("truth", "bilinear", "tiles", "featsharp", *others)
    outputs: dict[str, list[Tensor]] = {k: [] for k in names}
    for chunk in images.split(batch):
        passes = teacher_passes(teacher, chunk, factor)
        low = passes.low.permute(0, 3, 1, 2)
        size = (low.shape[-2] * factor, low.shape[-1] * factor)
        outputs["truth"].append(teacher.truth(chunk))
        outputs["bilinear"].append(
            F.interpolate(low, size=size, mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
        )
        outputs["tiles"].append(passes.tiles)
        outputs["featsharp"].append(upsampler.upsample(teacher, chunk).features)
        for name, other in others.items():
            outputs[name].append(other.upsample(teacher, chunk).features)
    truth = torch.cat(outputs.pop("truth"))
    return {k: normalized_mse(torch.cat(v), truth) for k, v in outputs.items()}


def bias_rate(scale: float) -> dict[str, float]:
    """``lr_scales`` giving the bias ``scale`` times the config's rate (none for 1)."""
    if scale == 1:
        return {}
    return {"upsampler.bias.": scale * LR_SCALES["upsampler.bias."]}


def run(kind: str, seed: int, args: argparse.Namespace) -> dict[str, float]:
    """One kind on one seed: train, measure, print its table and its line."""
    options = KINDS[kind]
    teacher = {
        "strength": args.strength,
        "resolution": args.resolution,
        "patch_size": args.patch,
        "seed": seed,
        **options,
    }
    cli = build(
        args.steps,
        args.batch,
        teacher,
        bias_rate(args.bias_lr_scale),
        args.warmup,
        seed,
        args.statistics_batches,
        {"zero": False, "mean": True, None: None}[args.bias_start],
    )
    harness.quiet()
    module = cli.model
    side = module.factor * module.teacher.resolution
    images = str(options["images"])
    count = args.steps * args.batch
    loader = DataLoader(
        Images(count, side, seed * SEED_STRIDE, images), batch_size=args.batch, shuffle=False
    )
    held_out = torch.stack(
        [IMAGES[images](HELD_OUT + seed * SEED_STRIDE + i, side) for i in range(args.eval_images)]
    )
    untrained = copy.deepcopy(module.upsampler)
    start = time.perf_counter()
    cli.trainer.fit(module, train_dataloaders=loader)
    seconds = time.perf_counter() - start
    # the untrained upsampler in the same normalized space (the pre-pass's statistics)
    untrained.normalizer.load_state_dict(module.upsampler.normalizer.state_dict())
    others = {
        "untrained": untrained,
        "exact bias": exact_bias(module.upsampler, module.teacher),
        "zero bias": exact_bias(module.upsampler, module.teacher, zero=True),
    }
    result = errors(module, others, held_out, 16)
    result.update(pattern_removed(module, module.teacher))
    t = module.teacher
    print(
        f"\n## kind {kind}, seed {seed}: context {options['context']}, pattern "
        f"{options['pattern']}, images {images}; R {t.resolution} px, {t.grid_size[0]}x"
        f"{t.grid_size[1]} tokens, {t.dim} channels, strength {args.strength}; factor "
        f"{module.factor} ({t.grid_size[0] * module.factor}x{t.grid_size[1] * module.factor}, "
        f"{side} px)"
    )
    print(
        f"trained {args.steps} steps of {args.batch} images in {seconds:.0f} s "
        f"({args.threads} threads); held-out images: {args.eval_images}"
    )
    print(
        f"learned bias (normalized space, less its mean): RMS {result['bias_rms']:.3f} against "
        f"the pattern's {result['pattern_rms']:.3f}, cosine with -pattern {result['cosine']:.3f}"
    )
    print("| upsampling | normalized MSE to truth |")
    print("| --- | ---: |")
    labels = {
        "untrained": "featsharp before training",
        "exact bias": "featsharp, its bias replaced by -pattern (diagnostic)",
        "zero bias": "featsharp, its bias replaced by zero (diagnostic)",
    }
    for name in ("bilinear", "tiles", "untrained", "featsharp", "exact bias", "zero bias"):
        print(f"| {labels.get(name, name)} | {result[name]:.4f} |")
    print(
        f"kind {kind}, seed {seed}: error to truth: bilinear {result['bilinear']:.4f}, "
        f"tiles {result['tiles']:.4f}, featsharp {result['featsharp']:.4f}; "
        f"pattern removed {result['removed']:.1f}%",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> dict[tuple[str, int], dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="teacher kinds"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds")
    parser.add_argument(
        "--steps", type=int, default=3000, help="training steps (default 3000: the paper's)"
    )
    parser.add_argument(
        "--warmup", type=int, default=100, help="warm-up steps (default 100: the paper's)"
    )
    parser.add_argument("--batch", type=int, default=4, help="images per step (the config's 4)")
    parser.add_argument(
        "--statistics-batches",
        type=int,
        default=100,
        help="batches of the normalizer's pre-pass (default 100 [choice]: 6,400 samples of "
        "32 channels)",
    )
    parser.add_argument(
        "--strength",
        type=float,
        default=1.0,
        help="planted pattern RMS / features' std (the c-radio rows' 1.0)",
    )
    parser.add_argument("--resolution", type=int, default=48, help="teacher's R (px)")
    parser.add_argument("--patch", type=int, default=12, help="teacher's patch (px)")
    parser.add_argument(
        "--bias-lr-scale",
        type=float,
        default=1.0,
        help="the bias's rate over the config's (default 1)",
    )
    parser.add_argument(
        "--bias-start",
        choices=("zero", "mean"),
        help="the bias's start: zero (the paper's) or the pre-pass's position-locked mean "
        "(FeatSharpModule.bias_from_statistics; default: the module's)",
    )
    parser.add_argument("--eval-images", type=int, default=64, help="held-out images")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {(k, s): run(k, s, args) for k in args.kinds for s in args.seeds}
    print("\n| kind | bilinear | tiles | featsharp | featsharp / bilinear | pattern removed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind in args.kinds:
        rows = [results[(kind, s)] for s in args.seeds]

        def mean(key: str, rows: list[dict[str, float]] = rows) -> float:
            return sum(r[key] for r in rows) / len(rows)

        print(
            f"| {kind} | {mean('bilinear'):.4f} | {mean('tiles'):.4f} | "
            f"{mean('featsharp'):.4f} | {mean('featsharp') / mean('bilinear'):.2f} | "
            f"{mean('removed'):.1f}% |"
        )
    wins = sum(r["featsharp"] < min(r["bilinear"], r["tiles"]) for r in results.values())
    removed = sum(r["removed"] > 50 for r in results.values())
    print(
        f"featsharp below bilinear and tiles on {wins} of {len(results)} runs; "
        f"pattern removed > 50 % on {removed} of {len(results)}"
    )
    return results


if __name__ == "__main__":
    main()
