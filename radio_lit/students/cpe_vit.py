"""A timm ViT student with Cropped Position Embeddings (AM-RADIO 4, "Multi-Resolution ViTs").

The student keeps one large grid of learned position embeddings (AM-RADIO uses 128 x 128
positions). In training each sample draws a random sub-window of that grid (random scale and
aspect ratio) which is resampled to the sample's patch grid, and, with ``cpe_dropout`` p, has
its whole position encoding zeroed with probability p (NVlabs/RADIO's ``pos_dropout``, 0.1 in
C-RADIOv4: notes 1.4, 7.3); in eval the whole grid is resized to the longest side and its
top-left window used, never dropped. The ViT therefore runs at any
resolution and aspect ratio that is a multiple of the patch size.

Options: ViTDet window augmentation for high-resolution training and as an inference
throughput option (:mod:`radio_lit.students.vitdet`, AM-RADIO supplement C); spectral
reparametrization of every linear layer in the blocks (:mod:`radio_lit.students.spectral_reparam`,
PHI-S A.7).

Parameters and buffers of ``CPEViT`` (``G = max_resolution / patch``, ``D`` = width, ``T`` =
``num_cls_tokens``, ``R`` = ``num_registers``):

- ``pos_embed [G * G, D]``: the CPE grid, row-major (row index ``y * G + x``), i.e. NVlabs/RADIO's
  ``patch_generator.pos_embed [1, G * G, D]`` without the leading 1. Dim 0 is large so that
  FSDP2 (which shards dim 0) really shards it. Checkpoints with the former ``[1, D, G, G]``
  layout are converted on load.
- ``cls_token [1, T, D]``; ``registers [1, R, D]`` (absent when ``R == 0``). The prefix is
  ``[summary tokens, registers]``: C-RADIOv4-H's 10 (``summary_tokens`` of its 3 teachers and
  7 registers) map onto timm's ``vit_huge_patch16_radio_v4`` ``cls_token`` + 9 ``reg_token``.
- ``patch_embed.*``, ``norm_pre.*``, ``norm.*``: timm's modules, timm's names
  (``patch_embed.proj.bias`` absent with ``patch_embed_bias: false``; ``norm`` an identity
  for a timm model without final norm, e.g. ``vit_huge_patch16_radio_v4``).
- ``blocks.<i>.*``: timm's blocks. With ``spectral_reparam`` every ``nn.Linear`` in them
  (``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2``) is a
  :class:`~radio_lit.students.spectral_reparam.SpectralLinear`: ``weight [out, in]``,
  ``bias [out]``, ``spectral_scale [C]`` (C = 3 chunks for ``qkv``, else 1),
  buffers ``spectral_u [C, out / C]``, ``spectral_v [C, in]`` (and, in version 2,
  ``spectral_version []``);
  :func:`~radio_lit.students.spectral_reparam.fold_spectral_reparam` turns them back into
  plain ``nn.Linear`` (``weight``, ``bias``) for export.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import timm
import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from radio_lit.students.base import Student, StudentOutput
from radio_lit.students.feature_normalizer import FeatureNormalizer, IntermediateFeatureNormalizer
from radio_lit.students.packing import packed_forward
from radio_lit.students.spectral_reparam import enable_spectral_reparam
from radio_lit.students.vitdet import (
    default_num_windowed,
    run_windowed,
    windowed_blocks,
    windowed_step,
)

Triple = tuple[float, float, float]


def cpe_eval_window(grid: Tensor, hw: tuple[int, int], align_corners: bool) -> Tensor:
    """Eval-mode CPE: the grid ``[1, D, G, G]`` bilinearly resized to the longest side of the
    ``h x w`` patch grid, and its top-left window ``[1, D, h, w]`` (AM-RADIO 4)."""
    h, w = hw
    side = max(h, w)
    if side != grid.shape[-1]:
        grid = F.interpolate(grid, size=(side, side), mode="bilinear", align_corners=align_corners)
    return grid[:, :, :h, :w]


def _timm_vit(name: str, pretrained: bool, kwargs: dict[str, Any]) -> VisionTransformer:
    if name not in timm.list_models(pretrained=False):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise ValueError(
            f"unknown timm model {name!r}; list them with timm.list_models('vit_*') "
            f"(close names: {close})"
        )
    model = timm.create_model(
        name,
        pretrained=pretrained,
        num_classes=0,
        global_pool="",
        dynamic_img_size=True,
        **kwargs,
    )
    if not isinstance(model, VisionTransformer):
        raise TypeError(
            f"timm model {name!r} is a {type(model).__name__}; the CPE student needs a plain "
            "timm VisionTransformer (vit_*, deit_*, …)"
        )
    return model


def _token_count(count: int | None, names: list[str] | None) -> int:
    """``num_cls_tokens`` from the options: ``count``, or one per ``summary_tokens`` name."""
    if names is not None:
        if not names or len(set(names)) != len(names):
            raise ValueError(
                f"summary_tokens={names} must name each teacher once (one summary token per "
                "name, in token order)"
            )
        if count not in (None, len(names)):
            raise ValueError(
                f"num_cls_tokens={count} but summary_tokens names {len(names)} teachers: leave "
                "num_cls_tokens out (one token per summary_tokens name)"
            )
        return len(names)
    if count is not None and count < 1:
        raise ValueError("num_cls_tokens must be at least 1")
    return 1 if count is None else count


class CPEViT(Student):
    """timm VisionTransformer + CPE + ``num_cls_tokens`` summary tokens.

    Args:
        model: timm model name of a ``VisionTransformer`` (e.g. ``vit_base_patch16_224``;
            PHI-S A.7 initializes from timm's ``vit_[base,large]_patch16_224``; C-RADIOv4-H's
            architecture is ``vit_huge_patch16_radio_v4``: ViT-H/16, no final norm). Its own
            class and register tokens are replaced by this student's summary tokens and
            registers.
        pretrained: load timm's pretrained weights (from the hub or timm's cache).
        checkpoint: optional local file with a ``state_dict`` of the timm model.
        max_resolution: pixels covered by the CPE grid side; the grid holds
            ``max_resolution / patch_size`` positions per side (AM-RADIO: 128 -> 2048 px at /16).
        num_cls_tokens: summary tokens: one shared, one per summary teacher, or one per
            teacher, SAM included (NVlabs/RADIO's layout, ``cls_token_per_teacher``; a RADIO
            export needs 1 or this). ``None``: one per ``summary_tokens`` name, else 1.
        summary_tokens: the teacher each summary token belongs to, in token order (NVlabs'
            one CLS per teacher name): teacher ``t`` reads token ``summary_tokens.index(t)``
            whatever the stage's teachers, so a run whose stages add teachers keeps one layout
            and one token count (C-RADIOv4: ``[siglip2_g, dino_v3, sam3]`` from stage 1, SAM3
            joining in stage 3; :func:`~radio_lit.students.heads.summary_token_slots`).
            ``None``: the layout follows the stage's teachers (``num_cls_tokens``).
        num_registers: extra register tokens, dropped from the outputs.
        model_kwargs: extra timm constructor arguments (depth, embed_dim, num_heads,
            ``final_norm: false`` for no final LayerNorm, …).
        patch_embed_bias: ``false``: a patch embedding without bias, as C-RADIOv4's linear
            patch embedder (its timm port adds a zero bias). A bias the timm weights have is
            folded into the CPE grid first (the same function: every patch gets it).
        cpe_min_scale: smallest side fraction of the grid a training crop covers
            (sqrt(0.1) gives 10% of the area, as in RADIO).
        cpe_max_aspect: largest aspect-ratio distortion of a training crop (4/3).
        cpe_dropout: position-embedding dropout p: in training each sample's whole position
            encoding is zeroed with probability p, an independent draw per sample from torch's
            default generator (in a training step, the rank's forward stream:
            :mod:`radio_lit.training.random_streams`); kept samples are not rescaled. As
            NVlabs/RADIO trains the CPE (``pos_dropout``; 0.1 for C-RADIOv4, notes 1.4).
            Evaluation and export never drop. 0: off (the default).
        cpe_align_corners: how eval mode resizes the CPE grid to the input's longest side.
            ``True`` samples grid corners as training's windows do; ``False`` resizes as
            NVlabs/RADIO's inference code does (``ViTPatchGenerator``: bilinear,
            ``align_corners=False``), which a RADIO-format export requires.
        pixel_mean: per-channel mean of the input normalization; ``None`` takes the timm
            model's pretrained config (``vit.pretrained_cfg["mean"]``, e.g. 0.5 for augreg).
        pixel_std: per-channel std, likewise from ``vit.pretrained_cfg["std"]`` by default.
        spectral_reparam: σReparam on every linear layer of the blocks (AM-RADIO 4, PHI-S A.7).
        spectral_reparam_version: how its learned scale ``p`` gives ``gamma``: 1,
            ``gamma = p`` (weight decay pulls it toward 0, PHI-S A.7); 2, NVlabs/RADIO's
            ``gamma = softplus(p) + 0.05`` (toward 0.743, never below 0.05). See
            :mod:`radio_lit.students.spectral_reparam`.
        vitdet_window_sizes: ViTDet augmentation in training (AM-RADIO supplement C): each
            training forward samples one window size (patches per side) from this list with
            torch's global RNG, among the sizes that tile the input's patch grid; an input no
            size tiles (e.g. a low-resolution partition) runs global attention. ``None``: off.
        vitdet_num_windowed: windowed blocks before each global block; ``None`` gives ViTDet's
            layout of 4 evenly spaced global blocks. The last block is always global.
        vitdet_eval_window_size: window size in eval mode (an inference throughput option,
            AM-RADIO table 8); ``None``: global attention. May be set on the instance later.
        vitdet_probability: the chance that a training step runs ViTDet windows (then each
            forward draws its window as above), global attention otherwise ``[choice]``: one
            draw per optimizer step from the run's seed and the step number, the same on every
            rank and after a resume (:meth:`begin_step`,
            :func:`~radio_lit.students.vitdet.windowed_step`). 1: every step (the default).
            Evaluation and export follow ``vitdet_eval_window_size`` whatever it is.
        feature_normalizer: a published model's fixed feature whitening on the patch features
            (``(f - mean) txᵀ``, buffers loaded by ``init_from``;
            :mod:`radio_lit.students.feature_normalizer`).
        intermediate_normalizers: layers of the published model's intermediate normalizer
            (0: none), carried into exports, not applied.
        intermediate_rotation_per_layer: whether it has one rotation per layer.
    """

    def __init__(
        self,
        model: str = "vit_base_patch16_224",
        pretrained: bool = False,
        checkpoint: str | None = None,
        max_resolution: int = 2048,
        num_cls_tokens: int | None = None,
        summary_tokens: list[str] | None = None,
        num_registers: int = 0,
        model_kwargs: dict[str, Any] | None = None,
        patch_embed_bias: bool = True,
        cpe_min_scale: float = math.sqrt(0.1),
        cpe_max_aspect: float = 4.0 / 3.0,
        cpe_dropout: float = 0.0,
        cpe_align_corners: bool = True,
        pixel_mean: Triple | None = None,
        pixel_std: Triple | None = None,
        spectral_reparam: bool = True,
        spectral_reparam_version: Literal[1, 2] = 1,
        vitdet_window_sizes: list[int] | None = None,
        vitdet_num_windowed: int | None = None,
        vitdet_eval_window_size: int | None = None,
        vitdet_probability: float = 1.0,
        feature_normalizer: bool = False,
        intermediate_normalizers: int = 0,
        intermediate_rotation_per_layer: bool = False,
    ) -> None:
        super().__init__()
        vit = _timm_vit(model, pretrained, dict(model_kwargs or {}))
        # The timm architecture, as a RADIO export records it (``args.model``, ``model_kwargs``).
        self.timm_model = model
        self.timm_kwargs = dict(model_kwargs or {})
        if checkpoint is not None:
            path = Path(checkpoint)
            if not path.is_file():
                raise FileNotFoundError(f"student checkpoint {path} does not exist")
            vit.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        patch = vit.patch_embed.patch_size
        if patch[0] != patch[1]:
            raise ValueError(f"square patches only, got {patch}")
        self.patch_size = int(patch[0])
        if max_resolution % self.patch_size:
            raise ValueError(
                f"max_resolution {max_resolution} must be a multiple of the patch size "
                f"{self.patch_size}"
            )
        num_cls_tokens = _token_count(num_cls_tokens, summary_tokens)
        self.summary_tokens = list(summary_tokens) if summary_tokens is not None else None
        self.embed_dim = int(vit.embed_dim)
        self.num_cls_tokens = num_cls_tokens
        self.num_registers = num_registers
        self.cpe_min_scale = cpe_min_scale
        self.cpe_log_aspect = math.log(cpe_max_aspect)
        if not 0.0 <= cpe_dropout < 1.0:
            raise ValueError(
                f"cpe_dropout must lie in [0, 1), got {cpe_dropout}: the chance that a training "
                "sample's whole position encoding is zeroed (C-RADIOv4: 0.1)"
            )
        self.cpe_dropout = cpe_dropout
        self.cpe_align_corners = cpe_align_corners

        self.grid_side = max_resolution // self.patch_size
        self.pos_embed = nn.Parameter(self._initial_grid(vit))
        self.cls_token = nn.Parameter(self._initial_cls(vit, num_cls_tokens))
        # Whether the timm model itself has a class token (SigLIP-style models have none):
        # NVlabs/RADIO's loader rebuilds the timm model and keys its summary tokens on it.
        self.timm_class_token = vit.cls_token is not None
        self.registers = (
            nn.Parameter(torch.randn(1, num_registers, self.embed_dim) * 0.02)
            if num_registers
            else None
        )
        vit.pos_embed = None
        vit.cls_token = None
        vit.reg_token = None
        self.patch_embed = vit.patch_embed
        if not patch_embed_bias:
            self._drop_patch_bias()
        self.norm_pre = vit.norm_pre
        self.blocks = vit.blocks
        self.norm = vit.norm
        # A published model's fixed feature whitening (students.feature_normalizer): buffers.
        self.feature_normalizer = FeatureNormalizer(self.embed_dim) if feature_normalizer else None
        self.intermediate_normalizer = (
            IntermediateFeatureNormalizer(
                intermediate_normalizers, self.embed_dim, intermediate_rotation_per_layer
            )
            if intermediate_normalizers
            else None
        )
        config = vit.pretrained_cfg or {}
        self.pixel_mean: Triple = tuple(pixel_mean or config.get("mean", IMAGENET_DEFAULT_MEAN))
        self.pixel_std: Triple = tuple(pixel_std or config.get("std", IMAGENET_DEFAULT_STD))
        if spectral_reparam:
            enable_spectral_reparam(self.blocks, spectral_reparam_version)

        eval_size = [] if vitdet_eval_window_size is None else [vitdet_eval_window_size]
        for option, sizes in [
            ("vitdet_window_sizes", vitdet_window_sizes or []),
            ("vitdet_eval_window_size", eval_size),
        ]:
            if any(size < 1 for size in sizes):
                raise ValueError(f"{option} must be positive window sizes in patches, got {sizes}")
        depth = len(self.blocks)
        num_windowed = (
            default_num_windowed(depth) if vitdet_num_windowed is None else vitdet_num_windowed
        )
        if not 0.0 <= vitdet_probability <= 1.0:
            raise ValueError(
                f"vitdet_probability must lie in [0, 1], got {vitdet_probability}: the chance "
                "that a training step runs ViTDet windows"
            )
        if vitdet_probability < 1.0 and not vitdet_window_sizes:
            raise ValueError(
                f"vitdet_probability {vitdet_probability} needs vitdet_window_sizes (the windows "
                "a training step may run): set both, or neither"
            )
        self.vitdet_window_sizes = list(vitdet_window_sizes or [])
        self.vitdet_eval_window_size = vitdet_eval_window_size
        self.vitdet_probability = vitdet_probability
        # This training step's draw (begin_step); before any, windowed only if p is 1.
        self._vitdet_this_step = vitdet_probability >= 1.0
        self.windowed = windowed_blocks(depth, num_windowed)
        self._untiled_grids: set[tuple[int, int, tuple[int, ...]]] = set()

    def _initial_grid(self, vit: VisionTransformer) -> Tensor:
        """``[G * G, D]`` CPE grid, resampled from the timm position embeddings."""
        pos = vit.pos_embed.detach()
        if not vit.no_embed_class:
            pos = pos[:, vit.num_prefix_tokens :]
        side = int(math.isqrt(pos.shape[1]))
        grid = pos.reshape(1, side, side, -1).permute(0, 3, 1, 2)
        resized = F.interpolate(
            grid.float(),
            size=(self.grid_side, self.grid_side),
            mode="bilinear",
            align_corners=True,
        )
        # FSDP2's fully_shard needs contiguous parameters, and shards dim 0.
        return resized[0].permute(1, 2, 0).reshape(-1, self.embed_dim).contiguous()

    def _drop_patch_bias(self) -> None:
        """No bias in the patch embedding; a bias it had moves into the CPE grid ``[G * G, D]``
        (added to every patch token either way; resampling the grid keeps a constant)."""
        proj = self.patch_embed.proj
        if proj.bias is not None:
            with torch.no_grad():
                self.pos_embed.add_(proj.bias.to(self.pos_embed.dtype))
        proj.register_parameter("bias", None)

    def _initial_cls(self, vit: VisionTransformer, count: int) -> Tensor:
        """``[1, T, D]`` summary tokens: timm's CLS token as the first block sees it.

        timm adds ``pos_embed[:, 0]`` to the CLS token unless ``no_embed_class``; the student
        adds no position embedding to its summary tokens, so each copies the sum.
        """
        if vit.cls_token is None:
            return torch.randn(1, count, self.embed_dim) * 0.02
        cls = vit.cls_token.detach()
        if not vit.no_embed_class:
            cls = cls + vit.pos_embed.detach()[:, :1]
        return cls.expand(1, count, -1).clone()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Tensor],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Converts a CPE grid saved in the former ``[1, D, G, G]`` layout to ``[G * G, D]``."""
        key = prefix + "pos_embed"
        grid = state_dict.get(key)
        if grid is not None and grid.ndim == 4 and grid.shape[:2] == (1, self.embed_dim):
            state_dict[key] = grid[0].permute(1, 2, 0).reshape(-1, self.embed_dim)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # -- CPE ----------------------------------------------------------------------------------
    def position_embeddings(self, batch: int, hw: tuple[int, int]) -> Tensor:
        """``[B, h, w, D]`` (training: random crop per sample, each zeroed with probability
        ``cpe_dropout``) or ``[1, h, w, D]`` (eval).

        Sampled in float32 whatever the parameter dtype (a bf16 mixed-precision policy would
        otherwise round the sampling coordinates); the result is float32.
        """
        g = self.grid_side
        grid = self.pos_embed.float().reshape(g, g, -1).permute(2, 0, 1).unsqueeze(0)
        h, w = hw
        if self.training:
            window = self._random_window(grid, batch, h, w).permute(0, 2, 3, 1)
            if self.cpe_dropout > 0.0:
                keep = torch.rand(batch, 1, 1, 1, device=grid.device) >= self.cpe_dropout
                window = window * keep
            return window
        return cpe_eval_window(grid, hw, self.cpe_align_corners).permute(0, 2, 3, 1)

    def _random_window(self, grid: Tensor, batch: int, h: int, w: int) -> Tensor:
        """Resample a random window (scale, aspect, offset per sample) of ``grid [1, D, G, G]``
        to ``[B, D, h, w]``.

        Every sample's ``h x w`` points are sampled from the one grid in one call, stacked as
        a ``B h x w`` map [choice]: ``grid_sample`` of the grid expanded to ``B`` copies would
        give the same values, but its backward writes a dense ``[B, D, G, G]`` gradient and
        sums it over the copies (a ViT-H at 2048 px max: 84 MB a sample; on a CPU a quarter
        of a small distillation's step, benchmarks/README.md)."""
        device = grid.device
        scale = torch.empty(batch, 1, 1, device=device).uniform_(self.cpe_min_scale, 1.0)
        log_aspect = torch.empty(batch, 1, 1, device=device).uniform_(
            -self.cpe_log_aspect, self.cpe_log_aspect
        )
        aspect = log_aspect.exp()
        extent = torch.stack([scale * aspect, scale / aspect], dim=-1).clamp_(0.0, 1.0)
        offset = torch.rand(batch, 1, 1, 2, device=device) * (1.0 - extent)
        ys = torch.linspace(0.0, 1.0, h, device=device)
        xs = torch.linspace(0.0, 1.0, w, device=device)
        unit = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)  # [h, w, 2] as (x, y)
        coords = (unit.unsqueeze(0) * extent + offset) * 2.0 - 1.0  # [B, h, w, 2]
        window = F.grid_sample(
            grid,
            coords.reshape(1, batch * h, w, 2),
            mode="bilinear",
            padding_mode="border",
            align_corners=True,
        )  # [1, D, B h, w]
        return window.reshape(grid.shape[1], batch, h, w).transpose(0, 1)

    # -- blocks -------------------------------------------------------------------------------
    def begin_step(self, seed: int, step: int) -> None:
        """Before training step ``step``: whether its training forwards may run ViTDet windows
        (probability ``vitdet_probability``; :func:`~radio_lit.students.vitdet.windowed_step`)."""
        self._vitdet_this_step = windowed_step(self.vitdet_probability, seed, step)

    def vitdet_window(self, hw: tuple[int, int]) -> int | None:
        """This forward's ViTDet window size for an ``h x w`` patch grid, or ``None`` (global).

        Training, in a step drawn windowed (:meth:`begin_step`), samples uniformly (torch's
        global RNG) among ``vitdet_window_sizes`` that tile the grid; eval uses
        ``vitdet_eval_window_size`` if it tiles the grid.
        """
        h, w = hw
        if self.training:
            sizes = self.vitdet_window_sizes if self._vitdet_this_step else []
        else:
            size = self.vitdet_eval_window_size
            sizes = [] if size is None else [size]
        if not sizes:
            return None
        tiling = [s for s in sizes if h % s == 0 and w % s == 0]
        if not tiling:
            key = (h, w, tuple(sizes))
            if key not in self._untiled_grids:
                self._untiled_grids.add(key)
                warnings.warn(
                    f"ViTDet window sizes {sizes} tile no {h}x{w} patch grid: global attention "
                    "for this input (pick window sizes dividing the patch grid)",
                    stacklevel=3,
                )
            return None
        if len(tiling) == 1:
            return tiling[0]
        return tiling[int(torch.randint(len(tiling), ()))]

    def run_blocks(self, tokens: Tensor, num_prefix: int, hw: tuple[int, int]) -> Tensor:
        """The transformer blocks on ``[B, P + h * w, D]`` tokens, ViTDet-windowed if enabled."""
        window = self.vitdet_window(hw)
        if window is None:
            return self.blocks(tokens)
        return run_windowed(self.blocks, tokens, num_prefix, hw, window, self.windowed)

    # -- forward ------------------------------------------------------------------------------
    def embed(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Normalized images ``[B, 3, H, W]`` -> tokens ``[B, P + h * w, D]`` (summary tokens,
        registers, then the patches with their position embeddings, row-major) and ``(h, w)``."""
        height, width = images.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"student input {height}x{width} is not a multiple of the patch size "
                f"{self.patch_size}; pick a student resolution divisible by {self.patch_size}"
            )
        x = self.patch_embed(images)  # [B, h, w, D]
        batch, h, w, dim = x.shape
        x = x + self.position_embeddings(batch, (h, w)).to(x.dtype)
        prefix = [self.cls_token.expand(batch, -1, -1)]
        if self.registers is not None:
            prefix.append(self.registers.expand(batch, -1, -1))
        return torch.cat([*prefix, x.reshape(batch, h * w, dim)], dim=1), (h, w)

    def forward(
        self, images: Tensor | Sequence[Tensor], kernel: str | None = None
    ) -> StudentOutput | list[StudentOutput]:
        """Normalized images ``[B, 3, H, W]`` (H, W multiples of the patch) -> StudentOutput.

        A list of such batches (of any resolutions) runs as one packed forward
        (:func:`~radio_lit.students.packing.packed_forward` with attention ``kernel``, default
        ``sdpa_mask``) and gives one output per batch, as one forward per batch would."""
        if not isinstance(images, Tensor):
            return packed_forward(self, list(images), kernel or "sdpa_mask")
        x, (h, w) = self.embed(images)
        num_prefix = self.num_cls_tokens + self.num_registers
        x = self.norm(self.run_blocks(self.norm_pre(x), num_prefix, (h, w)))
        return self.output(x, (h, w))

    def output(self, x: Tensor, grid: tuple[int, int]) -> StudentOutput:
        """The summary tokens ``[B, T, D]`` and patch features ``[B, h, w, D]`` of the trunk's
        normed tokens ``x [B, T + R + h w, D]``; the feature normalizer (NVlabs') applies to
        the features only, before the adaptors."""
        features = x[:, self.num_cls_tokens + self.num_registers :]
        if self.feature_normalizer is not None:
            features = self.feature_normalizer(features)
        return StudentOutput(
            summary=x[:, : self.num_cls_tokens],
            features=features.reshape(x.shape[0], *grid, x.shape[-1]),
        )
