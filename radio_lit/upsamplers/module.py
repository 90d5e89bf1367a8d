"""FeatSharpModule: trains one teacher's upsampler by multi-view consistency (FeatSharp paper,
arXiv 2502.16025, section 3.4; notes 4.4), run by ``radio-lit fit --config
configs/featsharp/<teacher>.yaml``.

One step, per batch of crops ``[B, 3, S, S]``:

1. the crop at ``k R`` px and ``n`` jittered views of it with their transforms
   (:class:`~radio_lit.upsamplers.views.JitteredViews`, kornia);
2. one batched call of the frozen teacher: the low-resolution pass, the ``k x k`` tiles and
   the ``n`` views at ``R`` px (:func:`~radio_lit.upsamplers.passes.teacher_passes`); while
   the statistics are estimated (``radio_lit.callbacks.TeacherStatsEstimation``) all of them
   update the normalizer;
3. the upsampler's ``k h x k w`` prediction (:class:`~radio_lit.upsamplers.FeatSharp`),
   warped into each view (kornia's ``warp_perspective``, reflection at the border), brought to
   ``h x w`` by the learned attention downsampler and compared with the teacher's normalized,
   de-biased output on that view, weighted by coverage, tile seams and the learned
   uncertainty (:mod:`~radio_lit.upsamplers.objective`).

The teacher is frozen and left out of checkpoints (as in distillation); the upsampler with its
normalizer, the downsampler and the uncertainty net are saved, and a resumed run continues
exactly (``radio_lit.callbacks.RandomStates`` restores the generators the views and the
logit dropout draw from).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from radio_lit.data.views import as_float_images, resize_view
from radio_lit.teachers import Teacher
from radio_lit.upsamplers.downsampler import AttentionDownsampler
from radio_lit.upsamplers.featsharp import FeatSharp
from radio_lit.upsamplers.objective import (
    Uncertainty,
    cell_average,
    consistency_loss,
    seam_weights,
)
from radio_lit.upsamplers.passes import TeacherPasses, teacher_passes
from radio_lit.upsamplers.views import JitteredViews, warp_cells

__all__ = ["FeatSharpModule", "UpsamplerFactory", "nadam"]

#: ``(dim, grid) -> upsampler`` for a teacher with ``dim`` channels on a ``grid`` of tokens.
UpsamplerFactory = Callable[[int, tuple[int, int]], FeatSharp]
#: ``(dim, factor) -> downsampler``, ``[B, C, k h, k w]`` -> ``[B, C, h, w]``.
DownsamplerFactory = Callable[[int, int], nn.Module]

#: The checkpoint entry that holds a random-weight teacher's weights (``keep_teacher_weights``).
TEACHER_WEIGHTS = "featsharp_teacher_weights"

#: Learning rates relative to the optimizer's, by parameter-name prefix (``lr_scales``):
#: JBU 0.2 and uncertainty 0.02 [notes 4.4], the de-biasing buffer 10 [choice].
LR_SCALES: dict[str, float] = {
    "upsampler.base.": 0.2,
    "uncertainty.": 0.02,
    "upsampler.bias.": 10.0,
}


def teacher_weights(teacher: nn.Module) -> dict[str, Tensor]:
    """Every persistent parameter and buffer of ``teacher``, a wrapper's inner teacher's too
    (:meth:`Teacher.state_dict` is empty at every depth: distillation checkpoints hold no
    teacher), keyed as :meth:`torch.nn.Module.load_state_dict` reads them."""
    state: dict[str, Any] = {}
    for prefix, module in teacher.named_modules(remove_duplicate=False):
        module._save_to_state_dict(state, f"{prefix}." if prefix else "", keep_vars=False)
    return state


def _teacher_not_saved(module: nn.Module, incompatible: Any) -> None:
    """Teacher weights are never in a checkpoint (they reload from their source)."""
    incompatible.missing_keys[:] = [
        k for k in incompatible.missing_keys if not k.startswith("teacher.")
    ]


def nadam(params: Any) -> torch.optim.Optimizer:
    """NAdam at 5e-4 [notes 4.4]."""
    return torch.optim.NAdam(params, lr=5e-4)


class FeatSharpModule(pl.LightningModule):
    """Multi-view training of :class:`FeatSharp` for one frozen teacher (module docstring).

    Args:
        teacher: the frozen teacher whose features are upsampled.
        upsampler: the upsampler, built for the teacher's channels and grid (its
            ``init_args`` give the factor and the parts).
        views: the jittered views (default :class:`JitteredViews`: 5 per image).
        downsampler: the learned downsampler of the objective (default
            :class:`AttentionDownsampler`).
        seam_weight: weight of the cells at tile seams before renormalizing [notes 4.4: 2].
        uncertainty: learn the per-position uncertainty weighting [notes 4.4: on].
        optimizer: the optimizer over the parameter groups (default NAdam, 5e-4 [notes 4.4]).
        lr_scales: learning rate of a group relative to the optimizer's, by parameter-name
            prefix: the base upsampler 0.2 (1e-4) and the uncertainty net 0.02 (1e-5)
            [notes 4.4]; the de-biasing buffer 10 (5e-3) [choice: the paper gives it no rate
            of its own; at the base rate the fusion block learns to reproduce a teacher's
            position-locked pattern from the tile pass's copies of it faster than the bias
            cancels it, and the error to the true features grows with training
            (benchmarks/featsharp.py, benchmarks/README.md)]. Given entries add to these or
            replace them.
        warmup_steps: linear warm-up steps [notes 4.4: 100], from ``warmup_start`` of the rate
            [notes 4.4: 0.1], then cosine decay to ``min_lr_ratio`` [choice: 0].
        warmup_start: see ``warmup_steps``.
        min_lr_ratio: see ``warmup_steps``.
        keep_teacher_weights: also save the teacher's weights in checkpoints, for teachers with
            random weights (the quickstarts), so that an
            :class:`~radio_lit.upsamplers.UpsampledTeacher` gets the teacher its upsampler was
            trained on [choice]; real teachers reload from their own source.
    """

    def __init__(
        self,
        teacher: Teacher,
        upsampler: UpsamplerFactory = FeatSharp,
        views: JitteredViews | None = None,
        downsampler: DownsamplerFactory = AttentionDownsampler,
        seam_weight: float = 2.0,
        uncertainty: bool = True,
        optimizer: OptimizerCallable = nadam,
        lr_scales: dict[str, float] | None = None,
        warmup_steps: int = 100,
        warmup_start: float = 0.1,
        min_lr_ratio: float = 0.0,
        keep_teacher_weights: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(
            ignore=["teacher", "upsampler", "views", "downsampler", "optimizer"]
        )
        self.teacher = teacher
        self.upsampler = upsampler(teacher.feature_dim, teacher.grid_size)
        self.factor = self.upsampler.factor
        self.views = views if views is not None else JitteredViews()
        self.downsampler = downsampler(teacher.feature_dim, self.factor)
        self.uncertainty = Uncertainty(teacher.feature_dim) if uncertainty else None
        grid = (teacher.grid_size[0] * self.factor, teacher.grid_size[1] * self.factor)
        self.register_buffer(
            "seams", seam_weights(grid, self.factor, seam_weight), persistent=False
        )
        self.optimizer_factory = optimizer
        self.lr_scales = {**LR_SCALES, **(lr_scales or {})}
        self.warmup_steps, self.warmup_start = warmup_steps, warmup_start
        self.min_lr_ratio = min_lr_ratio
        self.keep_teacher_weights = keep_teacher_weights
        self.estimate_statistics = self.refit_statistics = False  # TeacherStatsEstimation's
        self.register_load_state_dict_post_hook(_teacher_not_saved)

    # -- the statistics callback's protocol (radio_lit.callbacks.statistics) ------------------
    def teacher_statistics(self) -> dict[str, nn.ModuleDict]:
        """The teacher's normalizer, estimated first (TeacherStatsEstimation)."""
        return {"normalizers": nn.ModuleDict({"teacher": self.upsampler.normalizer})}

    # -- one step ----------------------------------------------------------------------------
    def passes(self, images: Tensor, views: Tensor | None = None) -> TeacherPasses:
        """The teacher's passes (and views), into the statistics while they are estimated."""
        passes = teacher_passes(self.teacher, images, self.factor, views)
        if self.estimate_statistics:
            seen = [passes.low, passes.tiles] + ([] if passes.extra is None else [passes.extra])
            normalizer = self.upsampler.normalizer
            normalizer.update(torch.cat([f.reshape(-1, f.shape[-1]) for f in seen]))
            if self.refit_statistics:
                normalizer.fit()
        return passes

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        images = as_float_images(batch)
        high = resize_view(images, self.factor * self.teacher.resolution)
        views, matrices = self.views(high)
        passes = self.passes(images, views)
        prediction = self.upsampler(passes.low, passes.tiles, high)
        losses = self.view_losses(prediction, passes.extra, matrices, high.shape[-1])
        self.log_dict(losses, batch_size=images.shape[0])
        return losses["train/loss"]

    def view_losses(
        self, prediction: Tensor, targets: Tensor, matrices: Tensor, pixels: int
    ) -> dict[str, Tensor]:
        """The consistency loss of ``prediction [B, k h, k w, C]`` (normalized) against the
        teacher's outputs on the views, ``targets [B n, h, w, C]`` (teacher space), whose
        transforms are ``matrices [B n, 3, 3]`` on the ``pixels``-side image."""
        count = self.views.count
        cell = pixels / prediction.shape[2]
        moved = prediction.permute(0, 3, 1, 2).repeat_interleave(count, 0)
        warped = warp_cells(moved, matrices, cell)
        shape = (moved.shape[0], 1, *moved.shape[2:])
        coverage = warp_cells(moved.new_ones(shape), matrices, cell, "zeros")[:, 0]
        seams = warp_cells(self.seams.expand(shape).to(moved), matrices, cell)[:, 0]
        weight = cell_average(coverage * seams, self.factor)
        lowered = self.downsampler(warped).permute(0, 2, 3, 1)
        target = self.upsampler.prepare(targets)
        log_scale = None if self.uncertainty is None else self.uncertainty(target.detach())
        loss = consistency_loss(lowered, target, weight, log_scale)
        logs = {"train/loss": loss, "train/mse": consistency_loss(lowered, target, weight)}
        if log_scale is not None:
            logs["train/uncertainty"] = log_scale.mean()
        logs["train/bias_rms"] = self.upsampler.bias.bias.square().mean().sqrt()
        return logs

    def validation_step(self, batch: Tensor, batch_idx: int) -> Tensor | None:
        """``val/loss``: the prediction brought back to the teacher's grid against the
        teacher's own low-resolution pass (normalized, de-biased)."""
        if not self.upsampler.normalizer.is_fitted:
            return None  # a fresh run has no teacher statistics before its first step
        images = as_float_images(batch)
        high = resize_view(images, self.factor * self.teacher.resolution)
        passes = self.passes(images)
        prediction = self.upsampler(passes.low, passes.tiles, high)
        lowered = self.downsampler(prediction.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        loss = (lowered - self.upsampler.prepare(passes.low)).square().mean()
        self.log("val/loss", loss, batch_size=images.shape[0], sync_dist=True)
        return loss

    # -- optimization ------------------------------------------------------------------------
    def trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters of the upsampler, downsampler and uncertainty net."""
        for name, parameter in self.named_parameters():
            if parameter.requires_grad:
                yield name, parameter

    def configure_optimizers(self) -> dict[str, Any]:
        groups: dict[float, list[nn.Parameter]] = {}
        for name, parameter in self.trainable_parameters():
            prefix = next((p for p in self.lr_scales if name.startswith(p)), None)
            groups.setdefault(1.0 if prefix is None else self.lr_scales[prefix], []).append(
                parameter
            )
        optimizer = self.optimizer_factory(
            [{"params": p, "lr_scale": s} for s, p in groups.items()]
        )
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * group["lr_scale"]
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup, start, floor = self.warmup_steps, self.warmup_start, self.min_lr_ratio

        def factor(step: int) -> float:
            if step < warmup:
                return start + (1 - start) * step / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # -- checkpoints -------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.keep_teacher_weights:
            checkpoint[TEACHER_WEIGHTS] = teacher_weights(self.teacher)
