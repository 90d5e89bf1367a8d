"""FeatSharpModule: trains one teacher's upsampler by multi-view consistency (FeatSharp paper,
arXiv 2502.16025, section 3.4; notes 4.4), run by ``radio-lit fit --config
configs/featsharp/<teacher>.yaml``.

One step, per batch of crops ``[B, 3, S, S]``:

1. the crop at ``k R`` px and ``n`` jittered views of it with their transforms
   (:class:`~radio_lit.upsamplers.views.JitteredViews`, kornia), drawn from this rank's own
   stream (as the logit dropout of step 3), so N ranks draw N sets of views and masks
   (:mod:`radio_lit.training.random_streams`);
2. one batched call of the frozen teacher: the low-resolution pass, the ``k x k`` tiles and
   the ``n`` views at ``R`` px (:func:`~radio_lit.upsamplers.passes.teacher_passes`);
3. the upsampler's ``k h x k w`` prediction (:class:`~radio_lit.upsamplers.FeatSharp`),
   warped into each view (kornia's ``warp_perspective``, reflection at the border), brought to
   ``h x w`` by the learned attention downsampler and compared with the teacher's normalized,
   de-biased output on that view, weighted by coverage, tile seams and the learned
   uncertainty (:mod:`~radio_lit.upsamplers.objective`).

The normalized (PHI-S) space is fixed before the first optimizer step, as FeatSharp's: a
pre-pass over ``statistics_batches`` training batches accumulates the teacher's
low-resolution pass only, and the normalizer is fitted once and never updated again
(:meth:`FeatSharpModule.on_train_start`): the bias, the fusion block, the downsampler and the
uncertainty net all learn in one basis (PHI-S table 10: an eigh-based transform shifts a lot on
small updates of the statistics).

The teacher is frozen and left out of checkpoints (as in distillation); the upsampler with its
normalizer (statistics and fit: a resumed run skips the pre-pass), the downsampler and the
uncertainty net are saved, with every rank's view and dropout streams, and a resumed run
continues exactly (``radio_lit.callbacks.RandomStates`` restores the global generators).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from radio_lit.data.views import as_float_images, resize_view
from radio_lit.teachers import Teacher
from radio_lit.training.random_streams import RankStream, gather_ranks, own_rank
from radio_lit.training.student_step import run_seed
from radio_lit.upsamplers.curvature import locked_curvature, precondition, preconditioner
from radio_lit.upsamplers.downsampler import AttentionDownsampler
from radio_lit.upsamplers.featsharp import FeatSharp
from radio_lit.upsamplers.objective import (
    Uncertainty,
    cell_average,
    consistency_loss,
    seam_weights,
)
from radio_lit.upsamplers.passes import low_pass, teacher_passes
from radio_lit.upsamplers.views import JitteredViews, warp_cells

__all__ = ["FeatSharpModule", "UpsamplerFactory", "nadam"]

#: ``(dim, grid) -> upsampler`` for a teacher with ``dim`` channels on a ``grid`` of tokens.
UpsamplerFactory = Callable[[int, tuple[int, int]], FeatSharp]
#: ``(dim, factor) -> downsampler``, ``[B, C, k h, k w]`` -> ``[B, C, h, w]``.
DownsamplerFactory = Callable[[int, int], nn.Module]

#: The checkpoint entry that holds a random-weight teacher's weights (``keep_teacher_weights``).
TEACHER_WEIGHTS = "featsharp_teacher_weights"

#: The checkpoint entry that holds every rank's view and dropout streams.
RANDOM_STREAMS = "featsharp_random_streams"
#: :class:`~radio_lit.training.random_streams.RankStream` purposes: the jittered views, the
#: downsampler's logit dropout.
VIEW_STREAM, DROPOUT_STREAM = 3, 4
#: The seed of the views drawn for the curvature of the bias's objective (the same on every
#: rank, at every start and resume; torch's generators are left as they were) [choice].
CURVATURE_SEED = 51

#: Learning rates relative to the optimizer's, by parameter-name prefix (``lr_scales``):
#: JBU 0.2 and uncertainty 0.02 [notes 4.4], the de-biasing buffer 100 [choice].
LR_SCALES: dict[str, float] = {
    "upsampler.base.": 0.2,
    "uncertainty.": 0.02,
    "upsampler.bias.": 100.0,
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


def shrunk_locked_mean(sums: Tensor, normalizer: nn.Module) -> Tensor:
    """The pre-pass's position-locked mean ``[C, h, w]`` in the normalized space, each token's
    shrunk by its own standard error (James-Stein, positive part) [choice].

    Args:
        sums: ``[2 + C, h, w]``: the image count, the features' sums per channel, the sum of
            their squared norms, at every token (teacher space).
        normalizer: the fitted normalizer (teacher space -> normalized).

    A token's mean ``m`` less the grid's ``m̄`` is kept times ``max(0, 1 - tr(Σ) / (n
    ||m - m̄||²))``, ``tr(Σ) / n`` its squared standard error over ``n`` images: a 10-batch
    estimate of a grid with no pattern is shrunk to nothing, a pattern well above the noise is
    kept; the result is centred again over the grid. The ratio is taken in the teacher's space
    (PHI-S's linear part is one rotation and one scale, which leave it unchanged).
    """
    count, dim = sums[0].clamp_min(1), sums.shape[0] - 2
    mean = sums[1 : 1 + dim] / count  # [C, h, w]
    spread = (sums[1 + dim] / count - mean.square().sum(0)).clamp_min(0)  # tr(Σ) per token
    offset = mean - mean.mean((1, 2), keepdim=True)
    keep = (1 - spread / count / offset.square().sum(0).clamp_min(1e-12)).clamp_min(0)
    mean = mean.permute(1, 2, 0).float()  # [h, w, C]
    locked = normalizer(mean) - normalizer(mean.mean((0, 1), keepdim=True))
    shrunk = locked * keep.float()[..., None]
    return (shrunk - shrunk.mean((0, 1), keepdim=True)).permute(2, 0, 1)  # zero over the grid


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
            [notes 4.4]; the de-biasing buffer 100 (5e-2) [choice: the paper gives it no rate
            of its own; Adam moves a parameter by about its rate per step, and a high-norm
            token's pattern is several units in the normalized space, so at 5e-3 the bias is
            still far from it after hundreds of steps (benchmarks/featsharp.py)]. Given
            entries add to these or replace them.
        warmup_steps: linear warm-up steps [notes 4.4: 100], from ``warmup_start`` of the rate
            [notes 4.4: 0.1], then cosine decay to ``min_lr_ratio`` [choice: 0].
        warmup_start: see ``warmup_steps``.
        min_lr_ratio: see ``warmup_steps``.
        statistics_batches: training batches of the pre-pass that estimates the normalizer
            from the teacher's low-resolution pass before the first optimizer step
            [notes 2.1: FeatSharp's base config, 3,000]; fewer when an epoch is shorter.
        bias_from_statistics: start the de-biasing buffer at the negative of the pre-pass's
            position-locked mean (the low-resolution pass's mean at each token over the
            pre-pass's images, less its mean over the grid, in the normalized space) instead
            of zero [choice; the paper starts it at zero. With the preconditioned gradient
            (``precondition_views``) both starts win on every cell of benchmarks/featsharp.py
            with a pattern; the pre-pass start is nearer the answer from the first step]. The
            estimate is shrunk by its own standard error (:func:`shrunk_locked_mean`): a short
            pre-pass plants no noise as a pattern.
        bias_consistency: weight of the bias's own objective (:meth:`locked_loss`: the
            low-resolution pass warped into each view against the teacher's output on it), from
            which alone the bias learns [choice; 0: the paper's training, the bias learning
            through the upsampler's objective]. Through the upsampler's objective the bias is
            added on both sides (inputs and targets) and the fusion block can carry what it has
            not cancelled from the inputs to the prediction, so its gradient is weak and
            misdirected (at 100 steps from zero on kind ``structured``: 9 % of the pattern
            removed, FeatSharp's error 1.4x bilinear's; learning from this objective alone:
            44 %, below bilinear; benchmarks/featsharp.py).
        precondition_views: views drawn (their transforms only) to estimate the curvature of
            :meth:`locked_loss` in the bias, whose inverse preconditions the bias's gradient
            before NAdam (:mod:`~radio_lit.upsamplers.curvature`) [choice: 128; 0: NAdam on
            the raw gradient, as the paper's]. The views hardly change a smooth pattern, and
            NAdam on the raw gradient grows a tilt there: from a zero start on a structured
            pattern at an 8x8 grid, 300 steps, 31 % of it removed; preconditioned (and the
            bias centred, :meth:`BiasBuffer.pattern`) 89 %, FeatSharp 0.28 against
            bilinear's 0.74 (benchmarks/featsharp.py). Only with ``bias_consistency > 0``
            (the bias learns from :meth:`locked_loss` alone).
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
        statistics_batches: int = 3000,
        bias_from_statistics: bool = True,
        bias_consistency: float = 1.0,
        precondition_views: int = 128,
        keep_teacher_weights: bool = False,
    ) -> None:
        super().__init__()
        if statistics_batches < 1:
            raise ValueError(
                f"FeatSharpModule: statistics_batches must be at least 1, got {statistics_batches}"
            )
        if precondition_views < 0:
            raise ValueError(
                f"FeatSharpModule: precondition_views must be 0 (off) or more, got "
                f"{precondition_views}"
            )
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
        self.statistics_batches = statistics_batches
        self.bias_from_statistics = bias_from_statistics
        self.bias_consistency = bias_consistency
        self.precondition_views = precondition_views
        self._bias_hook: Any = None
        self.streams = {"views": RankStream(VIEW_STREAM), "dropout": RankStream(DROPOUT_STREAM)}
        self.register_load_state_dict_post_hook(_teacher_not_saved)

    # -- the normalized space, fixed before the first step -----------------------------------
    def on_train_start(self) -> None:
        """The pre-pass of a fresh run (module docstring): the normalizer's statistics from the
        low-resolution pass of the first ``statistics_batches`` batches of a fresh iterator of
        the training loader (per rank; the statistics pool every rank's), fitted once. A
        resumed run has them from its checkpoint and skips it. This rank's streams start
        (from the run's seed and the global rank) unless restored."""
        self.start_streams(self.global_rank)
        self.precondition_bias()
        if self.upsampler.normalizer.is_fitted:
            return
        batches = self.fit_normalizer(self.trainer.train_dataloader)
        logger = self.logger
        diagnostics = self.upsampler.normalizer.diagnostics()
        if logger is not None and diagnostics:
            logger.log_metrics({f"stats/teacher/{k}": float(v) for k, v in diagnostics.items()}, 0)
        rank_zero_info(
            f"FeatSharpModule: the teacher's normalizer estimated from {batches} batches of its "
            "low-resolution pass, fixed for the run"
        )

    @torch.no_grad()
    def precondition_bias(self) -> None:
        """From now on, the bias's gradient is multiplied by the preconditioner
        (:func:`~radio_lit.upsamplers.curvature.preconditioner`) of :meth:`locked_loss`'s
        curvature, estimated from ``precondition_views`` transforms of the views drawn from a
        fixed seed (:data:`CURVATURE_SEED`): the same on every rank, recomputed alike by a
        resumed run. Nothing with ``precondition_views = 0`` or ``bias_consistency = 0``."""
        if self._bias_hook is not None:
            self._bias_hook.remove()
            self._bias_hook = None
        if self.precondition_views <= 0 or self.bias_consistency <= 0:
            return
        side = self.factor * self.teacher.resolution
        bias = self.upsampler.bias.bias
        shape = (self.precondition_views, 3, side, side)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(CURVATURE_SEED)
            matrices = self.views.transforms(torch.zeros((), dtype=torch.float64).expand(shape))
        grid = tuple(bias.shape[1:])
        curvature = locked_curvature(matrices.to(bias.device), grid, side / grid[1])
        matrix = preconditioner(curvature).float()
        self._bias_hook = bias.register_hook(lambda gradient: precondition(gradient, matrix))

    @torch.no_grad()
    def fit_normalizer(self, loader: Iterable[Any]) -> int:
        """Accumulate the teacher's low-resolution pass over the first ``statistics_batches``
        batches of ``loader`` (images ``[B, 3, S, S]``) and fit the normalizer (and, with
        ``bias_from_statistics``, start the bias); returns the number of batches. Every rank
        calls it together (the statistics are all-reduced)."""
        normalizer = self.upsampler.normalizer
        normalizer.reset()
        strategy, precision = self.trainer.strategy, self.trainer.precision_plugin
        dim = self.teacher.feature_dim
        batches, sums = 0, torch.zeros(2 + dim, *self.teacher.grid_size)
        sums = sums.to(self.device, torch.float64)
        for batch in itertools.islice(loader, self.statistics_batches):
            images = as_float_images(strategy.batch_to_device(batch))
            with precision.forward_context():
                features = low_pass(self.teacher, images)
            normalizer.update(features)
            sums[0] += features.shape[0]
            sums[1 : 1 + dim] += features.double().sum(0).permute(2, 0, 1)
            sums[1 + dim] += features.double().square().sum((0, 3))
            batches += 1
        normalizer.fit()
        if self.bias_from_statistics:
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(sums)
            self.upsampler.bias.bias.copy_(-shrunk_locked_mean(sums, normalizer))
        return batches

    # -- one step ----------------------------------------------------------------------------
    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        images = as_float_images(batch)
        high = resize_view(images, self.factor * self.teacher.resolution)
        self.upsampler.bias.learning(self.bias_consistency <= 0)
        with self.streams["views"].active(high.device):
            views, matrices = self.views(high)
        passes = teacher_passes(self.teacher, images, self.factor, views)
        prediction = self.upsampler(passes.low, passes.tiles, high)
        losses = self.view_losses(prediction, passes.extra, matrices, high.shape[-1])
        if self.bias_consistency > 0:
            self.upsampler.bias.learning(True)
            locked = self.locked_loss(passes.low, passes.extra, matrices, high.shape[-1])
            self.upsampler.bias.learning(False)
            losses["train/locked"] = locked
            losses["train/loss"] = losses["train/loss"] + self.bias_consistency * locked
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
        with self.streams["dropout"].active(warped.device):
            lowered = self.downsampler(warped).permute(0, 2, 3, 1)
        target = self.upsampler.prepare(targets)
        log_scale = None if self.uncertainty is None else self.uncertainty(target.detach())
        loss = consistency_loss(lowered, target, weight, log_scale)
        logs = {"train/loss": loss, "train/mse": consistency_loss(lowered, target, weight)}
        if log_scale is not None:
            logs["train/uncertainty"] = log_scale.mean()
        applied = self.upsampler.bias.pattern(self.teacher.grid_size).detach()
        logs["train/bias_rms"] = applied.square().mean().sqrt()
        return logs

    def locked_loss(self, low: Tensor, targets: Tensor, matrices: Tensor, pixels: int) -> Tensor:
        """The views' consistency on the teacher's own grid, the bias's direct signal: the
        low-resolution pass ``low [B, h, w, C]`` (normalized, de-biased) warped into each view
        against the teacher's output on that view ``targets [B n, h, w, C]`` (normalized,
        de-biased), weighted by coverage. What the images put at a position moves with the
        view; what is locked to the token grid does not, so the mean residual over images and
        views is ``(I - W)(P + B)`` and vanishes only when the bias cancels the pattern ``P``
        [choice: FeatSharp's multi-view consistency applied to the teacher's outputs
        themselves, so the bias learns without waiting for the upsampler]."""
        count = self.views.count
        cell = pixels / low.shape[2]
        moved = self.upsampler.prepare(low).permute(0, 3, 1, 2).repeat_interleave(count, 0)
        warped = warp_cells(moved, matrices, cell).permute(0, 2, 3, 1)
        shape = (moved.shape[0], 1, *moved.shape[2:])
        coverage = warp_cells(moved.new_ones(shape), matrices, cell, "zeros")[:, 0]
        return consistency_loss(warped, self.upsampler.prepare(targets), coverage)

    def validation_step(self, batch: Tensor, batch_idx: int) -> Tensor | None:
        """``val/loss``: the prediction brought back to the teacher's grid against the
        teacher's own low-resolution pass (normalized, de-biased)."""
        if not self.upsampler.normalizer.is_fitted:
            return None  # a fresh run has no teacher statistics before its first step
        images = as_float_images(batch)
        high = resize_view(images, self.factor * self.teacher.resolution)
        passes = teacher_passes(self.teacher, images, self.factor)
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

    # -- random streams and checkpoints ------------------------------------------------------
    def start_streams(self, rank: int) -> None:
        """Seed the view and dropout streams of global rank ``rank`` from the run's seed
        (``seed_everything``'s), unless started or restored already."""
        for stream in self.streams.values():
            stream.start(run_seed(), rank)

    def stream_states(self) -> list[dict[str, Any]]:
        """Every rank's stream states, in rank order (every rank calls it together)."""
        return gather_ranks({name: s.state_dict() for name, s in self.streams.items()})

    def load_streams(self, ranks: list[dict[str, Any]] | None, world_size: int, rank: int) -> None:
        """Rank ``rank``'s streams from :meth:`stream_states`'s ``ranks`` (kept fresh, with a
        warning, from another rank count; nothing from a checkpoint written before them)."""
        state = own_rank(ranks, world_size, rank, "FeatSharp's view and dropout streams")
        for name, stream in self.streams.items():
            if state is not None and name in state:
                stream.load_state_dict(state[name])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self._trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
        self.load_streams(checkpoint.get(RANDOM_STREAMS), world, rank)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[RANDOM_STREAMS] = self.stream_states()
        if self.keep_teacher_weights:
            checkpoint[TEACHER_WEIGHTS] = teacher_weights(self.teacher)
