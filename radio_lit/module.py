"""DistillationModule: one LightningModule per training stage (AM-RADIO sections 3-4; PHI-S 2).
It orchestrates; each step's logic lives in its component (DESIGN.md, "One training step")."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from radio_lit.core.compiling import CompileOption, compile_models
from radio_lit.data.views import as_float_images, resize_view
from radio_lit.export import ImportedHeads, initialize, module_inference_model
from radio_lit.export.checkpoint import keep_teacher_weights
from radio_lit.geometry.grid import GridPolicy, check_policies, student_input_size
from radio_lit.losses import MSE, BalancerFactory, Cosine, Weighted
from radio_lit.losses.angular import summary_dispersions
from radio_lit.metrics import DistillationMetrics
from radio_lit.metrics.logging import epoch_logs, logs_this_step, step_logs
from radio_lit.normalizers import Identity, Normalizer
from radio_lit.normalizers import statistics as teacher_stats
from radio_lit.students import Student, StudentOutput
from radio_lit.students.conditioner import StudentConditioner
from radio_lit.students.ema import EMAStudent, fill_missing_ema
from radio_lit.students.heads import summary_token_slots, teacher_heads
from radio_lit.students.packing import StudentPacking
from radio_lit.students.sharding import DEFAULT_FSDP2, FSDP2, shard_module
from radio_lit.students.spectral_reparam import spectral_step
from radio_lit.teachers import Teacher, TeacherOutput
from radio_lit.teachers.speed import SpeedReport
from radio_lit.training import losses, matching, normalization
from radio_lit.training import teachers as teacher_step
from radio_lit.training.batch import CachedBatch
from radio_lit.training.optim import adamw, optimizer_and_schedule, optimizer_of, parameter_groups
from radio_lit.training.partitions import Chunk, Partition, PartitionPlan
from radio_lit.training.per_teacher import check_names, loss_terms, per_teacher, teacher_normalizers
from radio_lit.training.student_step import DAMP, MESA, PatchShifts, StudentStep, student_shift
from radio_lit.training.views import step_views

NormalizerFactory = Callable[[int], Normalizer]
Size = tuple[int, int] | None  # a student resolution (H, W); None: model.student_resolution
Shift = Tensor | None  # ``[B, 2]`` whole-patch shifts of a view (radio_lit.geometry.shifts)
Outputs = Mapping[str, TeacherOutput]
Matches = Mapping[str, matching.TeacherMatch]

#: Modules and factories: in the CLI's config.yaml, not in checkpoints (weights_only loads).
_NOT_HYPERPARAMETERS = ["student", "teachers", "normalizer", "normalizer_overrides", "loss"]
_NOT_HYPERPARAMETERS += ["summary_loss", "balancer", "optimizer", "partitions", "shifts"]
_NOT_HYPERPARAMETERS += ["damp", "mesa", "fsdp2", "student_packing"]


class DistillationModule(pl.LightningModule):
    """Label-free multi-teacher distillation of one student for one training stage.

    Args:
        student: the student (a :class:`~radio_lit.students.Student`: ``CPEViT``, ``ERadio``).
        teachers: frozen teachers keyed by name (names key every per-teacher option).
        student_resolution: student input side, or ``(H, W)``; a multiple of its patch size.
        student_mean: pixel mean of the student's input (``None``: ``student.pixel_mean``).
        student_std: pixel std of the student's input (``None``: ``student.pixel_std``).
        normalizer: normalizer kind of every teacher (PHI-S 2.2; ``Identity``: MSE baseline).
        normalizer_overrides: per-teacher normalizer kinds that replace ``normalizer``.
        loss: feature loss (PHI-S eqs. 1-4) on the normalized target; ``MSE`` by default.
        summary_loss: summary loss: cosine (default, AM-RADIO eq. 2), ``AngleBalanced`` (C4 2.5).
        feature_weights: per-teacher feature loss weights ``gamma_k`` (default 1).
        summary_weights: per-teacher summary loss weights ``lambda_k`` (default 1).
        balancer: combines the loss terms (``Weighted``, AM-RADIO 3.4.1; radio_lit.losses).
        optimizer: built on :mod:`radio_lit.training.optim`'s parameter groups (AdamW, LR 1e-3).
        warmup_steps: linear LR warm-up steps before cosine annealing over the run.
        min_lr_ratio: final LR as a fraction of the peak LR.
        init_from: an earlier stage's checkpoint or a published RADIO (export/init_from.py).
        grid_policy: the loss grid: ``teacher`` (RADIOv2.5 4.2), ``student``, ``larger`` (grid.py).
        grid_policy_overrides: per-teacher grid policies that replace ``grid_policy``.
        partitions: teacher partitions, each with its batch, resolutions, ranks (AM-RADIO 4).
        shifts: shift-equivariant views (C-RADIOv4 report [C4] 2.3.1; radio_lit.geometry.shifts).
        damp: weight noise in training forwards (C4 2.4; radio_lit.students.damp).
        mesa: an EMA student and the MESA term (C4 2.3.2; radio_lit.students.ema).
        student_packing: a rank's chunks in one forward (radio_lit.students.packing).
        compile: ``torch.compile`` the student and teachers (``true`` or its kwargs; compiling.py).
        fsdp2: how ``ModelParallelStrategy`` shards the student (radio_lit.students.sharding).
    """

    def __init__(
        self,
        student: Student,
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
        init_from: str | dict[str, Any] | None = None,
        grid_policy: GridPolicy = "teacher",
        grid_policy_overrides: dict[str, GridPolicy] | None = None,
        partitions: dict[str, Partition] | None = None,
        shifts: PatchShifts | None = None,
        damp: DAMP | None = None,
        mesa: MESA | None = None,
        student_packing: StudentPacking | None = None,
        compile: CompileOption = False,
        fsdp2: FSDP2 = DEFAULT_FSDP2,
    ) -> None:
        super().__init__()
        if not teachers:
            raise ValueError("at least one teacher is required under model.teachers")
        self.save_hyperparameters(ignore=_NOT_HYPERPARAMETERS)
        self.student = student
        self.teachers = nn.ModuleDict(teachers)
        self.student_resolution = student_input_size(student_resolution, student.patch_size)
        self.conditioner = StudentConditioner.of(student, student_mean, student_std)  # saved
        self.feature_loss = loss if loss is not None else MSE()
        self.summary_loss = summary_loss if summary_loss is not None else Cosine()
        names = list(teachers)
        self.feature_weights = per_teacher(feature_weights, names, "feature_weights")
        self.summary_weights = per_teacher(summary_weights, names, "summary_weights")
        self.balancer = balancer(loss_terms(teachers, self.feature_weights, self.summary_weights))
        self.balancer.check_losses(self.feature_loss, self.summary_loss)
        self.metrics = nn.ModuleDict({s: DistillationMetrics(teachers) for s in ("val", "test")})
        self.optimizer_factory, self.warmup_steps = optimizer, warmup_steps
        self.min_lr_ratio = min_lr_ratio
        self.normalizers = teacher_normalizers(teachers, normalizer, normalizer_overrides)
        dims = {n: (t.feature_dim, t.summary_dim) for n, t in teachers.items()}
        summary_dims = {n: s for n, (_, s) in dims.items()}
        self.dispersions = summary_dispersions(summary_dims, self.summary_loss)
        self.heads = teacher_heads(student.embed_dim, dims)
        has_summary = {n: s is not None for n, s in summary_dims.items()}
        self.summary_token = summary_token_slots(has_summary, student)
        overrides = check_names(grid_policy_overrides or {}, names, "grid_policy_overrides")
        interpolatable = {name: t.interpolatable for name, t in teachers.items()}
        self.grid_policies = check_policies(grid_policy, overrides, interpolatable)
        size, parts = self.student_resolution, (shifts, damp, mesa, student_packing)
        self.partitions = PartitionPlan(partitions, names, size, student.patch_size)
        self.student_step = StudentStep(student.patch_size, size, self.conditioner, *parts)
        self.compile_option, self.fsdp2 = compile, fsdp2
        self.estimate_statistics = self.refit_statistics = False  # TeacherStatsEstimation's
        keep_teacher_weights(self)
        self.ema = None if mesa is None else EMAStudent(student, self.heads, mesa.decay)
        if mesa is not None:
            self.register_load_state_dict_pre_hook(fill_missing_ema)
        self.imported_heads = ImportedHeads()  # published heads, in their teachers' spaces
        if init_from is not None:  # the EMA too (radio_lit.export.init_from)
            self.load_student_weights(init_from)

    load_student_weights = initialize  # an earlier stage's or a published model's weights

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Every rank: teachers' accumulators that rank 0 does not hold reach it, with every
        rank's random streams (radio_lit.training.student_step), then it saves."""
        for prefix, statistics in self.teacher_statistics().items():
            sources, state = self.partitions.sources, checkpoint["state_dict"]
            teacher_stats.complete_checkpoint(statistics, sources, state, prefix)
        self.student_step.save_streams(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.student_step.load_streams(checkpoint, self._trainer)  # this rank's, on resume

    def teacher_statistics(self) -> dict[str, nn.ModuleDict]:
        """The estimated per-teacher statistics: normalizers, dispersions (AngleBalanced)."""
        return {"normalizers": self.normalizers, "dispersions": self.dispersions}

    def setup(self, stage: str) -> None:
        """Partitions on the run's ranks; statistics on their teachers' groups (AM-RADIO 4)."""
        self.partitions.setup(self.trainer, self.teacher_statistics().values())

    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy`` (students.sharding), then ``model.compile``."""
        if self._device_mesh is not None:
            mesh, precision = self.device_mesh["data_parallel"], str(self.trainer.precision)
            parts = self.student, self.heads, self.balancer, self.ema
            shard_module(*parts, mesh, precision, self.fsdp2)
        compile_models([self.student, *self.teachers.values()], self.compile_option)

    def configure_callbacks(self) -> list[pl.Callback]:
        """Teachers' compile times and FP8 layers, reported (radio_lit.teachers.speed)."""
        return [SpeedReport()]

    def trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters of the student, heads and balancer (teachers are never optimized)."""
        yield from self.student.named_parameters(prefix="student")
        yield from self.heads.named_parameters(prefix="heads")
        yield from self.balancer.named_parameters(prefix="balancer")

    def parameter_groups(self) -> list[dict[str, Any]]:  # radio_lit.training.optim.parameter_groups
        return parameter_groups(self.trainable_parameters())

    def configure_optimizers(self) -> dict[str, Any]:
        steps = self.trainer.estimated_stepping_batches, self.warmup_steps, self.min_lr_ratio
        return optimizer_and_schedule(self.optimizer_factory, self.trainable_parameters(), *steps)

    def run_teachers(
        self, crop: Tensor, teachers: tuple[str, ...] | None = None, student_resolution: Size = None
    ) -> dict[str, TeacherOutput]:
        """Frozen teachers (default: all) on their own views of the crop ``[B, 3, S, S]``."""
        names, grid = teachers or tuple(self.teachers), self.partitions.grid(student_resolution)
        return teacher_step.run_teachers(self.teachers, crop, names, grid)

    def chunk_teachers(self, batch: Tensor | CachedBatch, chunk: Chunk) -> dict[str, TeacherOutput]:
        """A chunk's teacher outputs (live, or a radio_lit.cache batch's) on the loss grid."""
        plan, policies = self.partitions, self.grid_policies
        return teacher_step.chunk_outputs(self.teachers, batch, chunk, plan, policies)

    def normalized_targets(self, outputs: Sequence[Outputs]) -> list[dict[str, Tensor]]:
        """Targets ``[{name: [B, H, W, C]}]`` per chunk, after estimation steps' statistics."""
        when = self.estimate_statistics, self.refit_statistics, self.partitions.sources
        out = normalization.normalized_targets(self.normalizers, self.dispersions, outputs, *when)
        self.imported_heads.follow(self.normalizers, self.heads, self.ema, optimizer_of(self))
        return out

    def match(
        self,
        crop: Tensor,
        outputs: Outputs,
        targets: Mapping[str, Tensor],
        student_resolution: Size = None,
        shift: Shift = None,
    ) -> dict[str, matching.TeacherMatch]:
        """The student on its view of ``crop``: its prediction of every teacher by the target."""
        student = self.run_student(crop, student_resolution, shift)
        return matching.match_teachers(
            student, self.heads, outputs, self.summary_token, shift, targets
        )

    def run_student(self, crop: Tensor, size: Size = None, shift: Shift = None) -> StudentOutput:
        """The student on its (shifted) view of ``crop`` (DAMP in training; student_step)."""
        return self.student_step.run(self.student, crop, size, shift, self.training)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's update, then the EMA student follows it (report 2.3.2)."""
        super().optimizer_step(*args, **kwargs)
        self.student_step.follow(self.ema, self.student, self.heads)

    def distillation_losses(self, matches: Matches, per_sample: bool = False) -> dict[str, Tensor]:
        """Per-teacher loss terms ``"<teacher>/feature_loss"`` etc. (scalars, or ``[B]``)."""
        dispersions = {name: d.value() for name, d in self.dispersions.items()}
        losses_ = self.feature_loss, self.summary_loss
        return losses.distillation_losses(matches, *losses_, per_sample, dispersions)

    def _shared_step(self, batch: Tensor | CachedBatch, stage: str) -> Tensor:
        """One step, each stage in the file named for it (DESIGN.md, "One training step")."""
        train, heads, tokens = stage == "train", self.heads, self.summary_token
        chunks = step_views(batch, self.partitions, self.student_step, self.teachers, train)
        outputs = [self.chunk_teachers(batch, c) for c in chunks]  # teachers, on the loss grid
        students = self.student_step.forward(self.student, chunks, self.training)  # student
        averages = self.student_step.average(self.ema, chunks) if train else None  # EMA (MESA)
        targets = self.normalized_targets(outputs)  # normalizers: imported heads follow a refit
        matches = [  # matching: each head's prediction by its teacher's normalized target
            matching.match_teachers(s, heads, out, tokens, student_shift(c), t)
            for c, s, out, t in zip(chunks, students, outputs, targets, strict=True)
        ]
        terms = [self.distillation_losses(m, self.balancer.per_sample) for m in matches]  # losses
        loss = losses.balanced_loss(self.balancer, chunks, terms, observe=train)  # balancer
        ema = self.student_step.mesa, averages, self.ema  # the EMA student's MESA term
        loss, extra = losses.with_mesa(loss, chunks, students, heads, *ema)
        if train:  # every head in every rank's backward (DDP)
            idle = losses.idle_heads_term(heads, self.partitions, self.student.embed_dim)
            loss = loss + idle.to(loss)
        for chunk_matches in [] if train else matches:  # metrics
            self.metrics[stage].update(chunk_matches, self.normalizers)
        if not train or logs_this_step(self._trainer):  # logging
            logs = step_logs(stage, loss, chunks, terms, self.balancer if train else None, extra)
            size, value = len(batch), logs.pop(f"{stage}/loss")
            self.log(f"{stage}/loss", value, prog_bar=True, batch_size=size, sync_dist=not train)
            self.log_dict(logs, batch_size=size, sync_dist=not train)
        return loss

    def on_validation_epoch_end(self) -> None:
        self.log_dict(epoch_logs("val", self.metrics["val"]), sync_dist=True)

    def on_test_epoch_end(self) -> None:
        self.log_dict(epoch_logs("test", self.metrics["test"]), sync_dist=True)

    def training_step(self, batch: Tensor | CachedBatch, batch_idx: int) -> Tensor:
        self.student_step.begin(self.student, self.global_step, self.global_rank)
        with spectral_step(self.student):  # σReparam: once per step, all layers together
            return self._shared_step(batch, "train")

    def validation_step(self, batch: Tensor, batch_idx: int) -> Tensor | None:
        ready = all(map(teacher_stats.statistics_ready, self.teacher_statistics().values()))
        if self.trainer.sanity_checking and not ready:
            return None  # a fresh stage has no teacher statistics before its first step
        return self._shared_step(batch, "val")

    def test_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return self._shared_step(batch, "test")

    def predict_step(self, batch: Tensor, batch_idx: int) -> dict[str, TeacherOutput]:
        """``{"backbone" | teacher: TeacherOutput}`` by the exported model (PHI-S A.6; export)."""
        if batch_idx == 0 or getattr(self, "_inference", None) is None:  # now's weights, folded
            object.__setattr__(self, "_inference", module_inference_model(self))
        return self._inference(resize_view(as_float_images(batch), self.student_resolution))
