"""DistillationModule: one LightningModule per training stage (AM-RADIO sections 3-4; PHI-S 2).

The data's way through a step (DESIGN.md): one uint8 crop batch arrives; the student and
every teacher get their own view of it; frozen teachers return ``summary [B, C_k]`` and
``features [B, H_k, W_k, C_k]``; the teacher features are moved to the loss grid (grid
policy, :mod:`radio_lit.grid`); teacher k's normalizer optionally updates its statistics on
that grid and maps the features to the normalized target space; the student's tokens go
through teacher k's adaptor heads, the feature map is moved to the same grid, and the
balancer (``model.balancer``) combines all teachers' loss terms for one backward. With
partitions (:mod:`radio_lit.partitions`) a rank runs its partitions' teachers on their slices
of the batch, each at a student resolution drawn for the step. Validation and test steps also
update the metrics (:mod:`radio_lit.metrics`), logged at the end of the epoch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from radio_lit.cache.batch import CachedBatch, student_pixels
from radio_lit.data.views import as_float_images, resize_view, teacher_view
from radio_lit.export import module_inference_model
from radio_lit.export.checkpoint import student_weights
from radio_lit.grid import GridPolicy, check_policies
from radio_lit.losses import MSE, BalancerFactory, Cosine, Weighted
from radio_lit.metrics import DistillationMetrics
from radio_lit.metrics.logging import logs_this_step, step_logs
from radio_lit.normalizers import Identity, Normalizer
from radio_lit.normalizers.statistics import accumulate_statistics, complete_checkpoint
from radio_lit.optim import adamw, optimizer_and_schedule, parameter_groups
from radio_lit.partitions import Partition, PartitionPlan, idle_heads_term
from radio_lit.per_teacher import check_names, loss_terms, per_teacher
from radio_lit.step import (
    TeacherMatch,
    chunk_keys,
    distillation_losses,
    match_teachers,
    run_teachers,
    teacher_outputs,
    to_loss_grid,
)
from radio_lit.students import CPEViT
from radio_lit.students.heads import summary_token_slots, teacher_heads
from radio_lit.students.sharding import shard_for_training
from radio_lit.students.spectral_reparam import request_power_iteration
from radio_lit.teachers import Teacher, TeacherOutput

NormalizerFactory = Callable[[int], Normalizer]

# Teachers are frozen and in eval mode by design (radio_lit.teachers.Teacher.train).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")

_TEACHERS_PREFIX = "teachers."
#: Modules and factories: recorded by the CLI's config.yaml, not in the checkpoint, so that
#: checkpoints load with torch.load(weights_only=True).
_NOT_HYPERPARAMETERS = ("student", "teachers", "normalizer", "normalizer_overrides", "loss")
_NOT_HYPERPARAMETERS += ("summary_loss", "balancer", "optimizer", "partitions")


class DistillationModule(pl.LightningModule):
    """Label-free multi-teacher distillation of one student for one training stage.

    Args:
        student: the student backbone (a :class:`~radio_lit.students.CPEViT`).
        teachers: frozen teachers keyed by name (names key every per-teacher option).
        student_resolution: student input side, or ``(H, W)``; a multiple of its patch size.
        student_mean: pixel mean of the student's input normalization; ``None`` takes the
            student's own (``student.pixel_mean``: its timm pretrained config).
        student_std: pixel std likewise (``student.pixel_std``).
        normalizer: normalizer kind for every teacher's features, called with the feature
            width to build one instance per teacher (PHI-S 2.2; ``Identity`` = MSE baseline).
        normalizer_overrides: per-teacher normalizer kinds that replace ``normalizer``.
        loss: feature loss (PHI-S eqs. 1-4), comparing the prediction with the normalized
            target; ``MSE`` by default.
        summary_loss: summary loss; cosine distance by default (AM-RADIO eq. 2).
        feature_weights: per-teacher feature loss weights ``gamma_k`` (default 1).
        summary_weights: per-teacher summary loss weights ``lambda_k`` (default 1; teachers
            without a summary, such as SAM, have none).
        balancer: combines the weighted loss terms into the step's loss; called with the terms
            ``{"<teacher>/<term>": weight}`` (``Weighted``: the naive sum, AM-RADIO 3.4.1;
            ``AdaLoss``, ``Uncertainty``, ``TeacherDropping``: see radio_lit.losses).
        optimizer: builds the optimizer from parameter groups of the student and heads only
            (AdamW, LR 1e-3, weight decay 0.02 by default; e.g. ``timm.optim.Lamb`` for the
            PHI-S recipe). Biases, norms, position embeddings and tokens get no weight decay;
            σReparam scales always do (PHI-S A.7).
        warmup_steps: linear LR warm-up steps before cosine annealing over the run.
        min_lr_ratio: final LR as a fraction of the peak LR.
        init_from: checkpoint of an earlier stage; only the student and head weights are
            taken (fresh optimizer, schedule and teacher statistics; PHI-S A.7).
        grid_policy: the grid every teacher's loss (and statistics) uses: ``"teacher"``
            (RADIOv2.5 4.2), ``"student"`` (PHI-S 3) or ``"larger"`` (AM-RADIO 4); see
            :mod:`radio_lit.grid`. SAM always keeps its own grid.
        grid_policy_overrides: per-teacher grid policies that replace ``grid_policy``.
        partitions: named teacher partitions with their own batch size, student
            resolution(s) and share of the ranks (AM-RADIO 4, PHI-S 3); default one partition
            with every teacher (RADIOv2.5 4.6). See :mod:`radio_lit.partitions`.
    """

    def __init__(
        self,
        student: CPEViT,
        teachers: dict[str, Teacher],
        student_resolution: int | tuple[int, int] = 256,
        student_mean: tuple[float, float, float] | None = None,
        student_std: tuple[float, float, float] | None = None,
        normalizer: NormalizerFactory = Identity,
        normalizer_overrides: dict[str, NormalizerFactory] | None = None,
        loss: nn.Module | None = None,
        summary_loss: nn.Module | None = None,
        feature_weights: dict[str, float] | None = None,
        summary_weights: dict[str, float] | None = None,
        balancer: BalancerFactory = Weighted,
        optimizer: OptimizerCallable = adamw,
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.0,
        init_from: str | None = None,
        grid_policy: GridPolicy = "teacher",
        grid_policy_overrides: dict[str, GridPolicy] | None = None,
        partitions: dict[str, Partition] | None = None,
    ) -> None:
        super().__init__()
        if not teachers:
            raise ValueError("at least one teacher is required under model.teachers")
        self.save_hyperparameters(ignore=list(_NOT_HYPERPARAMETERS))
        self.student = student
        self.teachers = nn.ModuleDict(teachers)
        self.student_resolution = (
            (student_resolution, student_resolution)
            if isinstance(student_resolution, int)
            else tuple(student_resolution)
        )
        patch = student.patch_size
        if any(side <= 0 or side % patch for side in self.student_resolution):
            raise ValueError(
                f"model.student_resolution {student_resolution} is not a positive multiple of "
                f"the student's patch size {patch}; use e.g. "
                f"{max(1, round(self.student_resolution[0] / patch)) * patch}"
            )
        self.student_mean = tuple(student_mean or student.pixel_mean)
        self.student_std = tuple(student_std or student.pixel_std)
        self.feature_loss = loss if loss is not None else MSE()
        self.summary_loss = summary_loss if summary_loss is not None else Cosine()
        names = list(teachers)
        self.feature_weights = per_teacher(feature_weights, names, "feature_weights")
        self.summary_weights = per_teacher(summary_weights, names, "summary_weights")
        self.balancer = balancer(loss_terms(teachers, self.feature_weights, self.summary_weights))
        self.balancer.check_losses(self.feature_loss, self.summary_loss)
        self.metrics = nn.ModuleDict({s: DistillationMetrics(teachers) for s in ("val", "test")})
        self.optimizer_factory = optimizer
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio

        overrides = check_names(normalizer_overrides or {}, names, "normalizer_overrides")
        self.normalizers = nn.ModuleDict(
            {n: overrides.get(n, normalizer)(t.feature_dim) for n, t in teachers.items()}
        )
        self.heads = teacher_heads(
            student.embed_dim, {n: (t.feature_dim, t.summary_dim) for n, t in teachers.items()}
        )
        has_summary = {n: t.summary_dim is not None for n, t in teachers.items()}
        self.summary_token = summary_token_slots(has_summary, student.num_cls_tokens)
        self.grid_policies = check_policies(
            grid_policy,
            check_names(grid_policy_overrides or {}, names, "grid_policy_overrides"),
            {name: t.interpolatable for name, t in teachers.items()},
        )
        self.partitions = PartitionPlan(
            partitions, list(teachers), self.student_resolution, student.patch_size
        )
        # Set each step by radio_lit.callbacks.TeacherStatsEstimation.
        self.estimate_statistics = False
        self.refit_statistics = False
        self.register_load_state_dict_post_hook(self._ignore_teacher_weights)
        if init_from is not None:
            self.load_student_weights(init_from)

    # -- checkpoints --------------------------------------------------------------------------
    @staticmethod
    def _ignore_teacher_weights(module: nn.Module, incompatible: Any) -> None:
        """Teacher weights are never saved (they reload from their source): not missing."""
        incompatible.missing_keys[:] = [
            k for k in incompatible.missing_keys if not k.startswith(_TEACHERS_PREFIX)
        ]

    def load_student_weights(self, checkpoint: str) -> None:
        """Take the student and head weights of an earlier stage's checkpoint (weights only;
        heads of teachers new in this stage start fresh)."""
        weights, _ = student_weights(checkpoint, self.state_dict(), self.heads)
        self.load_state_dict(weights, strict=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Every rank, before rank 0 writes: the accumulators of teachers that rank 0 does not
        run reach it from their groups (between refits only the group holds them)."""
        complete_checkpoint(self.normalizers, self.partitions.sources, checkpoint["state_dict"])

    # -- distributed --------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Place the partitions on this run's ranks; give each teacher's normalizer the
        process group of the ranks that run it (AM-RADIO 4, DESIGN.md "Distributed rules")."""
        self.partitions.place(self.trainer.world_size, self.trainer.global_rank)
        self.partitions.check_strategy(self.trainer.strategy)
        if not self.partitions.single:
            for name, (group, source) in self.partitions.process_groups().items():
                self.normalizers[name].set_process_group(group, source)

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``, shard the student (per block) and the heads (FSDP2).

        Teachers stay replicated and unsharded; normalizer statistics stay float64 buffers
        outside any mixed-precision policy (DESIGN.md, "Distributed rules").
        """
        if self._device_mesh is not None:
            bf16 = str(self.trainer.precision).startswith("bf16")
            mesh = self.device_mesh["data_parallel"]
            shard_for_training(self.student, self.heads.values(), self.balancer, mesh, bf16)

    # -- optimization -------------------------------------------------------------------------
    def trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters of the student, heads and balancer (teachers are never optimized)."""
        yield from self.student.named_parameters(prefix="student")
        yield from self.heads.named_parameters(prefix="heads")
        yield from self.balancer.named_parameters(prefix="balancer")

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The optimizer's named parameter groups (:func:`radio_lit.optim.parameter_groups`)."""
        return parameter_groups(self.trainable_parameters())

    def configure_optimizers(self) -> dict[str, Any]:
        return optimizer_and_schedule(
            self.optimizer_factory,
            self.trainable_parameters(),
            self.trainer.estimated_stepping_batches,
            self.warmup_steps,
            self.min_lr_ratio,
        )

    # -- the step -------------------------------------------------------------------------
    def run_teachers(
        self,
        crop: Tensor,
        teachers: tuple[str, ...] | None = None,
        student_resolution: tuple[int, int] | None = None,
    ) -> dict[str, TeacherOutput]:
        """Frozen teachers (default: all) on their own views of the crop ``[B, 3, S, S]``
        (:func:`radio_lit.step.run_teachers`; features on each teacher's own grid)."""
        grid = self._student_grid(student_resolution)
        return run_teachers(self.teachers, crop, teachers or tuple(self.teachers), grid)

    def _student_grid(self, resolution: tuple[int, int] | None) -> tuple[int, int]:
        height, width = resolution or self.student_resolution
        return height // self.student.patch_size, width // self.student.patch_size

    def on_loss_grid(
        self, outputs: Mapping[str, TeacherOutput], student_resolution: tuple[int, int] | None
    ) -> dict[str, TeacherOutput]:
        """Teacher outputs with features moved to each teacher's loss grid."""
        grid = self._student_grid(student_resolution)
        return to_loss_grid(outputs, self.teachers, self.grid_policies, grid)

    def normalized_targets(
        self, outputs: Sequence[Mapping[str, TeacherOutput]]
    ) -> list[dict[str, Tensor]]:
        """Teacher features in each normalizer's target space, one dict per chunk of the step
        (``[{name: [B, H, W, C]}]``), after this step's statistics update while estimation is
        on (:func:`radio_lit.normalizers.statistics.accumulate_statistics`)."""
        if self.estimate_statistics:
            features = [{name: out.features for name, out in chunk.items()} for chunk in outputs]
            accumulate_statistics(
                self.normalizers, features, self.refit_statistics, self.partitions.sources
            )
        return [
            {name: self.normalizers[name](out.features.float()) for name, out in chunk.items()}
            for chunk in outputs
        ]

    def match(
        self,
        crop: Tensor,
        outputs: Mapping[str, TeacherOutput],
        targets: Mapping[str, Tensor],
        student_resolution: tuple[int, int] | None = None,
    ) -> dict[str, TeacherMatch]:
        """The student on its view of ``crop`` (default ``model.student_resolution``), and its
        prediction of every teacher next to the target (:func:`radio_lit.step.match_teachers`)."""
        size = student_resolution or self.student_resolution
        student = self.student(teacher_view(crop, size, self.student_mean, self.student_std))
        return match_teachers(student, self.heads, outputs, targets, self.summary_token)

    def distillation_losses(
        self, matches: Mapping[str, TeacherMatch], per_sample: bool = False
    ) -> dict[str, Tensor]:
        """Per-teacher loss terms ``"<teacher>/feature_loss"`` etc. (scalars, or ``[B]``)."""
        return distillation_losses(matches, self.feature_loss, self.summary_loss, per_sample)

    def _shared_step(self, batch: Tensor | CachedBatch, stage: str) -> Tensor:
        crop = as_float_images(student_pixels(batch))
        chunks = self.partitions.chunks(crop, train=stage == "train")
        outputs = [  # live teachers, or the outputs a radio_lit.cache.CachedViews batch carries
            self.on_loss_grid(
                teacher_outputs(self.teachers, batch, c, self._student_grid(c.resolution)),
                c.resolution,
            )
            for c in chunks
        ]
        targets = self.normalized_targets(outputs)
        losses: dict[str, Tensor] = {}
        chunk_terms = []
        for chunk, out, target in zip(chunks, outputs, targets, strict=True):
            matches = self.match(chunk.crop, out, target, chunk.resolution)
            terms = self.distillation_losses(matches, per_sample=self.balancer.per_sample)
            chunk_terms.append(terms)
            losses.update(chunk_keys(chunk, terms, len(chunks)))
            if stage != "train":
                self.metrics[stage].update(matches, self.normalizers)
        if stage == "train":  # once per step on every rank, whatever its number of chunks
            self.balancer.observe(chunk_terms, [c.fraction for c in chunks])
        idle = self.partitions.idle_teachers() if stage == "train" else []
        loss = idle_heads_term(self.heads, idle, self.student.embed_dim).to(self.device)
        for chunk, terms in zip(chunks, chunk_terms, strict=True):
            loss = loss + chunk.weight * self.balancer(terms)
        if stage == "train" and not logs_this_step(self._trainer):
            return loss
        sync = stage != "train"
        batch_size = crop.shape[0]
        self.log(f"{stage}/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=sync)
        weights = self.balancer.effective_weights() if stage == "train" else None
        self.log_dict(step_logs(stage, losses, weights), batch_size=batch_size, sync_dist=sync)
        return loss

    def _log_metrics(self, stage: str) -> None:
        """Log the epoch's ``<stage>/<teacher>/<metric>`` values (radio_lit.metrics)."""
        metrics = self.metrics[stage]
        if metrics.updated:
            # Already reduced over all ranks by torchmetrics; the mean of equal values is a no-op.
            values = {f"{stage}/{k}": v for k, v in metrics.compute().items()}
            self.log_dict(values, sync_dist=True)
        metrics.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def training_step(self, batch: Tensor | CachedBatch, batch_idx: int) -> Tensor:
        request_power_iteration(self.student)  # σReparam: one per step, not per forward
        return self._shared_step(batch, "train")

    def validation_step(self, batch: Tensor, batch_idx: int) -> Tensor | None:
        if self.trainer.sanity_checking and not self.statistics_ready():
            return None  # a fresh stage has no teacher statistics before its first step
        return self._shared_step(batch, "val")

    def statistics_ready(self) -> bool:
        """Whether every normalizer can map targets (fitted, or needs no statistics)."""
        return all(n.is_fitted or not n.requires_statistics for n in self.normalizers.values())

    def test_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return self._shared_step(batch, "test")

    def on_predict_start(self) -> None:
        self._inference = None  # rebuilt from the current weights by the first predict_step

    def predict_step(self, batch: Tensor, batch_idx: int) -> dict[str, TeacherOutput]:
        """The student's estimate of every teacher, in the teacher's original space.

        Runs the exported inference model (:func:`radio_lit.export.module_inference_model`,
        what ``radio-lit export`` writes and ``radio_lit.load`` returns: normalizers folded
        into the feature heads, PHI-S A.6) on the crop resized to the student resolution.
        Returns ``{"backbone": TeacherOutput(summary [B, D], features [B, h, w, D]),
        name: TeacherOutput(summary [B, C_s] | None, features [B, h, w, C])}``.
        """
        if getattr(self, "_inference", None) is None:
            # A plain attribute, not a submodule: a folded copy, never trained or saved.
            object.__setattr__(self, "_inference", module_inference_model(self))
        return self._inference(resize_view(as_float_images(batch), self.student_resolution))
