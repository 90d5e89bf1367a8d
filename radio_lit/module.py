"""DistillationModule: one LightningModule per training stage (AM-RADIO sections 3-4; PHI-S 2).

It orchestrates; each step's logic lives in its component (DESIGN.md, "One training step"):
partitions, step (teachers, grid, heads), student_step (C-RADIOv4's parts around the student:
shifts, DAMP, EMA and MESA, per-step draws), normalizers.statistics, losses, metrics, optim,
students.sharding, export (checkpoints), cache (recorded teacher outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from radio_lit.cache.batch import CachedBatch, student_pixels
from radio_lit.compiling import CompileOption, compile_models
from radio_lit.data.views import as_float_images, resize_view
from radio_lit.errors import ConfigError
from radio_lit.export import module_inference_model
from radio_lit.export.checkpoint import ignore_teacher_weights, student_weights
from radio_lit.grid import GridPolicy, check_policies, student_input_size
from radio_lit.losses import MSE, BalancerFactory, Cosine, Weighted
from radio_lit.losses.angular import summary_dispersions
from radio_lit.metrics import DistillationMetrics
from radio_lit.metrics.logging import epoch_logs, logs_this_step, step_logs
from radio_lit.normalizers import Identity, Normalizer
from radio_lit.normalizers.statistics import (
    accumulate_statistics,
    complete_checkpoint,
    statistics_ready,
)
from radio_lit.optim import adamw, optimizer_and_schedule, parameter_groups
from radio_lit.partitions import Chunk, Partition, PartitionPlan, idle_heads_term
from radio_lit.per_teacher import check_names, loss_terms, per_teacher, teacher_normalizers
from radio_lit.shifts import PatchShifts
from radio_lit.step import (
    TeacherMatch,
    balanced_loss,
    distillation_losses,
    match_teachers,
    run_teachers,
    teacher_outputs,
    to_loss_grid,
)
from radio_lit.student_step import StudentStep, student_shift
from radio_lit.students import Student, StudentOutput
from radio_lit.students.damp import DAMP
from radio_lit.students.ema import MESA, EMAStudent, fill_missing_ema
from radio_lit.students.heads import summary_token_slots, teacher_heads
from radio_lit.students.sharding import DEFAULT_FSDP2, FSDP2, shard_for_training
from radio_lit.students.spectral_reparam import spectral_step
from radio_lit.teachers import Teacher, TeacherOutput

NormalizerFactory = Callable[[int], Normalizer]

#: Modules and factories: recorded by the CLI's config.yaml, not in the checkpoint, so that
#: checkpoints load with torch.load(weights_only=True).
_NOT_HYPERPARAMETERS = ("student", "teachers", "normalizer", "normalizer_overrides", "loss")
_NOT_HYPERPARAMETERS += ("summary_loss", "balancer", "optimizer", "partitions", "shifts")
_NOT_HYPERPARAMETERS += ("damp", "mesa", "fsdp2")


class DistillationModule(pl.LightningModule):
    """Label-free multi-teacher distillation of one student for one training stage.

    Args:
        student: the student backbone (a :class:`~radio_lit.students.Student`:
            :class:`~radio_lit.students.CPEViT` or :class:`~radio_lit.students.ERadio`).
        teachers: frozen teachers keyed by name (names key every per-teacher option).
        student_resolution: student input side, or ``(H, W)``; a multiple of its patch size.
        student_mean: pixel mean of the student's input (``None``: ``student.pixel_mean``).
        student_std: pixel std of the student's input (``None``: ``student.pixel_std``).
        normalizer: normalizer kind of every teacher (PHI-S 2.2; ``Identity``: MSE baseline).
        normalizer_overrides: per-teacher normalizer kinds that replace ``normalizer``.
        loss: feature loss (PHI-S eqs. 1-4) on the normalized target; ``MSE`` by default.
        summary_loss: summary loss; cosine distance by default (AM-RADIO eq. 2);
            ``AngleBalanced`` divides by each teacher's summary dispersion, a teacher
            statistic estimated like the normalizers' (C-RADIOv4 report 2.5).
        feature_weights: per-teacher feature loss weights ``gamma_k`` (default 1).
        summary_weights: per-teacher summary loss weights ``lambda_k`` (default 1).
        balancer: combines the loss terms (``Weighted``, AM-RADIO 3.4.1; radio_lit.losses).
        optimizer: built on :mod:`radio_lit.optim`'s parameter groups (AdamW, LR 1e-3).
        warmup_steps: linear LR warm-up steps before cosine annealing over the run.
        min_lr_ratio: final LR as a fraction of the peak LR.
        init_from: an earlier stage's checkpoint: student, head and EMA weights (PHI-S A.7).
        grid_policy: the grid of every teacher's loss and statistics: ``"teacher"``
            (RADIOv2.5 4.2), ``"student"`` (PHI-S 3), ``"larger"`` (AM-RADIO 4); radio_lit.grid.
        grid_policy_overrides: per-teacher grid policies that replace ``grid_policy``.
        partitions: named teacher partitions with their own batch size, resolution(s) and
            ranks (AM-RADIO 4, PHI-S 3; default: one, RADIOv2.5 4.6); radio_lit.partitions.
        shifts: shift-equivariant training (C-RADIOv4 report 2.3.1): every training step,
            the student and each live teacher see their view shifted by whole patches, and
            the feature loss is averaged over the overlap; ``None``: unshifted views.
        damp: multiplicative weight noise on the student's linear layers in training
            forwards (report 2.4; radio_lit.students.damp); ``None``: off.
        mesa: an EMA student and the shift-equivariant MESA term (report 2.3.2;
            radio_lit.students.ema); ``None``: no EMA.
        compile: ``torch.compile`` the student and each teacher (``true``, or the keyword
            arguments of ``torch.compile``); radio_lit.compiling.
        fsdp2: how ``ModelParallelStrategy`` shards the student (layout, resharding,
            prefetching, reduce dtype; radio_lit.students.sharding.FSDP2).
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
        init_from: str | None = None,
        grid_policy: GridPolicy = "teacher",
        grid_policy_overrides: dict[str, GridPolicy] | None = None,
        partitions: dict[str, Partition] | None = None,
        shifts: PatchShifts | None = None,
        damp: DAMP | None = None,
        mesa: MESA | None = None,
        compile: CompileOption = False,
        fsdp2: FSDP2 = DEFAULT_FSDP2,
    ) -> None:
        super().__init__()
        if not teachers:
            raise ValueError("at least one teacher is required under model.teachers")
        self.save_hyperparameters(ignore=list(_NOT_HYPERPARAMETERS))
        self.student = student
        self.teachers = nn.ModuleDict(teachers)
        self.student_resolution = student_input_size(student_resolution, student.patch_size)
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

        self.normalizers = teacher_normalizers(teachers, normalizer, normalizer_overrides)
        self.dispersions = summary_dispersions(
            {n: t.summary_dim for n, t in teachers.items()}, self.summary_loss
        )
        self.heads = teacher_heads(
            student.embed_dim, {n: (t.feature_dim, t.summary_dim) for n, t in teachers.items()}
        )
        has_summary = {n: t.summary_dim is not None for n, t in teachers.items()}
        self.summary_token = summary_token_slots(has_summary, student)
        self.grid_policies = check_policies(
            grid_policy,
            check_names(grid_policy_overrides or {}, names, "grid_policy_overrides"),
            {name: t.interpolatable for name, t in teachers.items()},
        )
        self.partitions = PartitionPlan(
            partitions, names, self.student_resolution, student.patch_size
        )
        self.student_step = StudentStep(
            self.student_resolution, self.student_mean, self.student_std, shifts, damp, mesa
        )
        self.compile_option = compile
        self.fsdp2 = fsdp2
        self.estimate_statistics = False  # both set each step by TeacherStatsEstimation
        self.refit_statistics = False
        self.register_load_state_dict_post_hook(ignore_teacher_weights)
        self.ema = None if mesa is None else EMAStudent(student, self.heads, mesa.decay)
        if mesa is not None:
            self.register_load_state_dict_pre_hook(fill_missing_ema)
        if init_from is not None:  # the EMA too (radio_lit.export.checkpoint.student_weights)
            self.load_student_weights(init_from)

    def load_student_weights(self, checkpoint: str) -> None:
        """Take the student and head weights of an earlier stage's checkpoint (weights only;
        heads of teachers new in this stage start fresh)."""
        weights, _ = student_weights(checkpoint, self.state_dict(), self.heads)
        self.load_state_dict(weights, strict=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Every rank: teachers' accumulators that rank 0 does not hold reach it, then it saves."""
        for prefix, statistics in self.teacher_statistics().items():
            sources, state = self.partitions.sources, checkpoint["state_dict"]
            complete_checkpoint(statistics, sources, state, prefix)

    def teacher_statistics(self) -> dict[str, nn.ModuleDict]:
        """Every per-teacher statistic estimated in the estimation steps, by attribute name:
        the normalizers and the summary dispersions (``AngleBalanced`` only)."""
        return {"normalizers": self.normalizers, "dispersions": self.dispersions}

    def setup(self, stage: str) -> None:
        """Place the partitions on this run's ranks; give each teacher's normalizer the
        process group of the ranks that run it (AM-RADIO 4, DESIGN.md "Distributed rules")."""
        try:
            self.partitions.place(self.trainer.world_size, self.trainer.global_rank)
            self.partitions.check_strategy(self.trainer.strategy)
        except ValueError as error:  # the run's ranks or strategy do not fit model.partitions
            raise ConfigError(str(error)) from error
        if not self.partitions.single:
            for name, (group, source) in self.partitions.process_groups().items():
                for statistics in self.teacher_statistics().values():
                    if name in statistics:
                        statistics[name].set_process_group(group, source)

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``, shard the student and heads and their EMA copy
        (FSDP2; teachers stay replicated; radio_lit.students.sharding.shard_for_training);
        then compile the student and teachers if ``compile`` says so (radio_lit.compiling)."""
        if self._device_mesh is not None:
            bf16 = str(self.trainer.precision).startswith("bf16")
            mesh = self.device_mesh["data_parallel"]
            heads, settings = self.heads.values(), self.fsdp2
            shard_for_training(self.student, heads, self.balancer, mesh, bf16, settings)
            if self.ema is not None:  # sharded alike, so that its update pairs shard with shard
                ema_heads = self.ema.heads.values()
                shard_for_training(self.ema.student, ema_heads, nn.Module(), mesh, bf16, settings)
        compile_models([self.student, *self.teachers.values()], self.compile_option)

    def trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters of the student, heads and balancer (teachers are never optimized)."""
        yield from self.student.named_parameters(prefix="student")
        yield from self.heads.named_parameters(prefix="heads")
        yield from self.balancer.named_parameters(prefix="balancer")

    def parameter_groups(self) -> list[dict[str, Any]]:  # radio_lit.optim.parameter_groups
        return parameter_groups(self.trainable_parameters())

    def configure_optimizers(self) -> dict[str, Any]:
        return optimizer_and_schedule(
            self.optimizer_factory,
            self.trainable_parameters(),
            self.trainer.estimated_stepping_batches,
            self.warmup_steps,
            self.min_lr_ratio,
        )

    def run_teachers(
        self,
        crop: Tensor,
        teachers: tuple[str, ...] | None = None,
        student_resolution: tuple[int, int] | None = None,
    ) -> dict[str, TeacherOutput]:
        """Frozen teachers (default: all) on their own views of the crop ``[B, 3, S, S]``."""
        grid = self._student_grid(student_resolution)
        return run_teachers(self.teachers, crop, teachers or tuple(self.teachers), grid)

    def _student_grid(self, resolution: tuple[int, int] | None) -> tuple[int, int]:
        height, width = resolution or self.student_resolution
        return height // self.student.patch_size, width // self.student.patch_size

    def chunk_teachers(self, batch: Tensor | CachedBatch, chunk: Chunk) -> dict[str, TeacherOutput]:
        """A chunk's teacher outputs (live, or those a radio_lit.cache batch carries) on the
        loss grid."""
        grid = self._student_grid(chunk.resolution)
        outputs = teacher_outputs(self.teachers, batch, chunk, grid)
        return to_loss_grid(outputs, self.teachers, self.grid_policies, grid)

    def normalized_targets(
        self, outputs: Sequence[Mapping[str, TeacherOutput]]
    ) -> list[dict[str, Tensor]]:
        """Teacher features ``[{name: [B, H, W, C]}]`` (one dict per chunk) in each normalizer's
        target space, after this step's statistics update (features, and summaries for the
        dispersions) while estimation is on."""
        features = [{name: out.features for name, out in chunk.items()} for chunk in outputs]
        if self.estimate_statistics:
            sources, refit = self.partitions.sources, self.refit_statistics
            seen = [  # tokens of shifted views that show the image only
                {n: o.features if o.valid is None else o.features[o.valid] for n, o in c.items()}
                for c in outputs
            ]
            accumulate_statistics(self.normalizers, seen, refit, sources)
            summaries = [
                {n: o.summary for n, o in c.items() if o.summary is not None} for c in outputs
            ]
            accumulate_statistics(self.dispersions, summaries, refit, sources)
        return [{n: self.normalizers[n](f.float()) for n, f in chunk.items()} for chunk in features]

    def match(
        self,
        crop: Tensor,
        outputs: Mapping[str, TeacherOutput],
        targets: Mapping[str, Tensor],
        student_resolution: tuple[int, int] | None = None,
        shift: Tensor | None = None,
    ) -> dict[str, TeacherMatch]:
        """The student on its view of ``crop`` (shifted by ``shift [B, 2]`` whole patches,
        radio_lit.shifts): its prediction of every teacher by the target."""
        student = self.run_student(crop, student_resolution, shift)
        heads, token = self.heads, self.summary_token
        return match_teachers(student, heads, outputs, targets, token, shift)

    def run_student(
        self,
        crop: Tensor,
        resolution: tuple[int, int] | None = None,
        shift: Tensor | None = None,
    ) -> StudentOutput:
        """The student (DAMP's weight noise in training) on its view of ``crop`` at
        ``resolution``, shifted by ``shift [B, 2]`` whole patches (radio_lit.student_step)."""
        return self.student_step.run(self.student, crop, resolution, shift, self.training)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's update, then the EMA student follows it (report 2.3.2)."""
        super().optimizer_step(*args, **kwargs)
        self.student_step.follow(self.ema, self.student, self.heads)

    def distillation_losses(
        self, matches: Mapping[str, TeacherMatch], per_sample: bool = False
    ) -> dict[str, Tensor]:
        """Per-teacher loss terms ``"<teacher>/feature_loss"`` etc. (scalars, or ``[B]``)."""
        dispersions = {name: d.value() for name, d in self.dispersions.items()}
        return distillation_losses(
            matches, self.feature_loss, self.summary_loss, per_sample, dispersions
        )

    def _shared_step(self, batch: Tensor | CachedBatch, stage: str) -> Tensor:
        train = stage == "train"
        crop = as_float_images(student_pixels(batch))  # data
        chunks = self.partitions.chunks(crop, train=train)  # views: partitions, resolutions
        if train:  # shift-equivariant views of live teachers
            chunks = self.student_step.views(chunks, live=not isinstance(batch, CachedBatch))
        outputs = [self.chunk_teachers(batch, c) for c in chunks]  # teachers, on the loss grid
        targets = self.normalized_targets(outputs)  # normalizers
        students = [  # student (DAMP noise in training)
            self.run_student(c.crop, c.resolution, student_shift(c)) for c in chunks
        ]
        matches = [  # heads
            match_teachers(s, self.heads, out, target, self.summary_token, student_shift(c))
            for c, s, out, target in zip(chunks, students, outputs, targets, strict=True)
        ]
        terms = [self.distillation_losses(m, self.balancer.per_sample) for m in matches]  # loss
        loss = balanced_loss(self.balancer, chunks, terms, observe=train)  # balancer
        extra_logs: dict[str, Tensor] = {}
        if train:  # the EMA student's MESA term; every head in every rank's backward (DDP)
            loss, extra_logs = self.student_step.add_mesa(
                loss, chunks, students, self.heads, self.ema
            )
            idle = self.partitions.idle_teachers()
            loss = loss + idle_heads_term(self.heads, idle, self.student.embed_dim).to(loss)
        else:
            for chunk_matches in matches:  # metrics
                self.metrics[stage].update(chunk_matches, self.normalizers)
        if not train or logs_this_step(self._trainer):
            size, weights = crop.shape[0], self.balancer.effective_weights() if train else None
            logs = step_logs(stage, loss, chunks, terms, weights, extra_logs)
            value = logs.pop(f"{stage}/loss")
            self.log(f"{stage}/loss", value, prog_bar=True, batch_size=size, sync_dist=not train)
            self.log_dict(logs, batch_size=size, sync_dist=not train)
        return loss

    def on_validation_epoch_end(self) -> None:
        self.log_dict(epoch_logs("val", self.metrics["val"]), sync_dist=True)

    def on_test_epoch_end(self) -> None:
        self.log_dict(epoch_logs("test", self.metrics["test"]), sync_dist=True)

    def training_step(self, batch: Tensor | CachedBatch, batch_idx: int) -> Tensor:
        self.student_step.begin(self.student, self.global_step)  # draws shared by all ranks
        with spectral_step(self.student):  # σReparam: once per step, all layers together
            return self._shared_step(batch, "train")

    def validation_step(self, batch: Tensor, batch_idx: int) -> Tensor | None:
        ready = all(map(statistics_ready, self.teacher_statistics().values()))
        if self.trainer.sanity_checking and not ready:
            return None  # a fresh stage has no teacher statistics before its first step
        return self._shared_step(batch, "val")

    def test_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return self._shared_step(batch, "test")

    def on_predict_start(self) -> None:
        self._inference = None  # rebuilt from the current weights by the first predict_step

    def predict_step(self, batch: Tensor, batch_idx: int) -> dict[str, TeacherOutput]:
        """Every teacher's estimate in its own space by the exported inference model
        (:func:`radio_lit.export.module_inference_model`; normalizers folded, PHI-S A.6) at
        the student resolution: ``{"backbone" | name: TeacherOutput}``."""
        if getattr(self, "_inference", None) is None:  # a folded copy, not a (saved) submodule
            object.__setattr__(self, "_inference", module_inference_model(self))
        return self._inference(resize_view(as_float_images(batch), self.student_resolution))
