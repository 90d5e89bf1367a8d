"""DistillationModule: one LightningModule per training stage (AM-RADIO sections 3-4; PHI-S 2).

The data's way through a step (DESIGN.md): one uint8 crop batch arrives; the student and
every teacher get their own view of it; frozen teachers return ``summary [B, C_k]`` and
``features [B, H_k, W_k, C_k]``; teacher k's normalizer optionally updates its statistics
and maps the features to the normalized target space; the student's tokens go through
teacher k's adaptor heads, the feature map is resized to teacher k's grid, and the weighted
losses of all teachers are summed for one backward.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from radio_lit.data.views import as_float_images, resize_view, teacher_view
from radio_lit.losses import MSE, Cosine
from radio_lit.normalizers import Identity, Normalizer
from radio_lit.students import CPEViT, TeacherHeads
from radio_lit.teachers import Teacher, TeacherOutput

NormalizerFactory = Callable[[int], Normalizer]

# Teachers are frozen and in eval mode by design (radio_lit.teachers.Teacher.train).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")

_TEACHERS_PREFIX = "teachers."
_STUDENT_PREFIXES = ("student.", "heads.")


def _adamw(params: Any) -> torch.optim.Optimizer:
    """The papers' default optimizer settings (AM-RADIO 4: AdamW, LR 1e-3; weight decay 0.02)."""
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.02)


@dataclass
class TeacherMatch:
    """The student's prediction of one teacher next to that teacher's target.

    Attributes:
        features: ``[B, H, W, C]`` the feature head's prediction on the loss grid, in the
            normalizer's target space.
        target: ``[B, H, W, C]`` the normalized teacher features on the same grid.
        summary: ``[B, C_s]`` the summary head's prediction, or ``None`` (no summary).
        summary_target: ``[B, C_s]`` the teacher's summary, or ``None``.
    """

    features: Tensor
    target: Tensor
    summary: Tensor | None = None
    summary_target: Tensor | None = None


def resize_features(features: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinearly resize a feature map ``[B, h, w, C]`` to ``[B, H, W, C]`` (AM-RADIO 4)."""
    if tuple(features.shape[1:3]) == tuple(size):
        return features
    nchw = features.permute(0, 3, 1, 2)
    return F.interpolate(nchw, size=size, mode="bilinear", align_corners=False).permute(0, 2, 3, 1)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, then cosine annealing to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class DistillationModule(pl.LightningModule):
    """Label-free multi-teacher distillation of one student for one training stage.

    Args:
        student: the student backbone (a :class:`~radio_lit.students.CPEViT`).
        teachers: frozen teachers keyed by name (names key every per-teacher option).
        student_resolution: student input side, or ``(H, W)``; a multiple of its patch size.
        student_mean: pixel mean of the student's input normalization.
        student_std: pixel std of the student's input normalization.
        normalizer: normalizer kind for every teacher's features, called with the feature
            width to build one instance per teacher (PHI-S 2.2; ``Identity`` = MSE baseline).
        normalizer_overrides: per-teacher normalizer kinds that replace ``normalizer``.
        loss: feature loss (PHI-S eqs. 1-4), comparing the prediction with the normalized
            target; ``MSE`` by default.
        summary_loss: summary loss; cosine distance by default (AM-RADIO eq. 2).
        feature_weights: per-teacher feature loss weights ``gamma_k`` (default 1).
        summary_weights: per-teacher summary loss weights ``lambda_k`` (default 1; teachers
            without a summary, such as SAM, have none).
        optimizer: builds the optimizer from parameter groups of the student and heads only
            (AdamW, LR 1e-3, weight decay 0.02 by default; e.g. ``timm.optim.Lamb`` for the
            PHI-S recipe). Biases, norms, position embeddings and tokens get no weight decay.
        warmup_steps: linear LR warm-up steps before cosine annealing over the run.
        min_lr_ratio: final LR as a fraction of the peak LR.
        init_from: checkpoint of an earlier stage; only the student and head weights are
            taken (fresh optimizer, schedule and teacher statistics; PHI-S A.7).
    """

    def __init__(
        self,
        student: CPEViT,
        teachers: dict[str, Teacher],
        student_resolution: int | tuple[int, int] = 256,
        student_mean: tuple[float, float, float] = (0.485, 0.456, 0.406),
        student_std: tuple[float, float, float] = (0.229, 0.224, 0.225),
        normalizer: NormalizerFactory = Identity,
        normalizer_overrides: dict[str, NormalizerFactory] | None = None,
        loss: nn.Module | None = None,
        summary_loss: nn.Module | None = None,
        feature_weights: dict[str, float] | None = None,
        summary_weights: dict[str, float] | None = None,
        optimizer: OptimizerCallable = _adamw,
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.0,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        if not teachers:
            raise ValueError("at least one teacher is required under model.teachers")
        # Plain values only, so checkpoints load with torch.load(weights_only=True); the
        # modules and factories are recorded by the CLI's config.yaml.
        self.save_hyperparameters(
            ignore=[
                "student",
                "teachers",
                "normalizer",
                "normalizer_overrides",
                "loss",
                "summary_loss",
                "optimizer",
            ]
        )
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
        self.student_mean = tuple(student_mean)
        self.student_std = tuple(student_std)
        self.feature_loss = loss if loss is not None else MSE()
        self.summary_loss = summary_loss if summary_loss is not None else Cosine()
        self.feature_weights = self._per_teacher(feature_weights, "feature_weights")
        self.summary_weights = self._per_teacher(summary_weights, "summary_weights")
        self.optimizer_factory = optimizer
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio

        overrides = self._check_names(normalizer_overrides or {}, "normalizer_overrides")
        self.normalizers = nn.ModuleDict(
            {
                name: overrides.get(name, normalizer)(teacher.feature_dim)
                for name, teacher in teachers.items()
            }
        )
        hidden = max(max(t.feature_dim, t.summary_dim or 0) for t in teachers.values())
        self.heads = nn.ModuleDict(
            {
                name: TeacherHeads(student.embed_dim, hidden, t.feature_dim, t.summary_dim)
                for name, t in teachers.items()
            }
        )
        self.summary_token = self._assign_summary_tokens()
        # Set each step by radio_lit.callbacks.TeacherStatsEstimation.
        self.estimate_statistics = False
        self.refit_statistics = False
        self.register_load_state_dict_post_hook(self._ignore_teacher_weights)
        if init_from is not None:
            self.load_student_weights(init_from)

    # -- construction helpers ---------------------------------------------------------------
    def _check_names(self, mapping: Mapping[str, Any], option: str) -> dict[str, Any]:
        unknown = sorted(set(mapping) - set(self.teachers))
        if unknown:
            raise ValueError(
                f"model.{option} names unknown teachers {unknown}; the teachers are "
                f"{sorted(self.teachers)}"
            )
        return dict(mapping)

    def _per_teacher(self, weights: Mapping[str, float] | None, option: str) -> dict[str, float]:
        given = self._check_names(weights or {}, option)
        return {name: float(given.get(name, 1.0)) for name in self.teachers}

    def _assign_summary_tokens(self) -> dict[str, int]:
        """Teacher name -> index of the student summary token its summary head reads."""
        with_summary = [n for n, t in self.teachers.items() if t.summary_dim is not None]
        tokens = self.student.num_cls_tokens
        if tokens not in (1, len(with_summary)):
            raise ValueError(
                f"the student has {tokens} summary tokens but {len(with_summary)} teachers "
                f"have a summary ({with_summary}); use num_cls_tokens=1 (shared) or "
                f"{len(with_summary)} (one per teacher)"
            )
        return {name: (i if tokens > 1 else 0) for i, name in enumerate(with_summary)}

    # -- checkpoints --------------------------------------------------------------------------
    @staticmethod
    def _ignore_teacher_weights(module: nn.Module, incompatible: Any) -> None:
        """Teacher weights are never saved (they reload from their source): not missing."""
        incompatible.missing_keys[:] = [
            k for k in incompatible.missing_keys if not k.startswith(_TEACHERS_PREFIX)
        ]

    def load_student_weights(self, checkpoint: str) -> None:
        """Take the student and head weights of an earlier stage's checkpoint (weights only)."""
        path = Path(checkpoint)
        if not path.is_file():
            raise FileNotFoundError(
                f"model.init_from: checkpoint {path} does not exist; point it at the previous "
                "stage's .ckpt (e.g. lightning_logs/version_0/checkpoints/last.ckpt)"
            )
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # truncated, not a checkpoint, or pickled objects
            raise ValueError(
                f"model.init_from: {path} cannot be read as a checkpoint "
                f"({str(error).splitlines()[0]}); point it at "
                "a .ckpt written by radio-lit fit"
            ) from error
        state = state.get("state_dict", state) if isinstance(state, dict) else {}
        weights = {k: v for k, v in state.items() if k.startswith(_STUDENT_PREFIXES)}
        if not weights:
            raise ValueError(f"{path} holds no student or head weights (no 'student.*' keys)")
        own = {k for k in self.state_dict() if k.startswith(_STUDENT_PREFIXES)}
        missing, unexpected = sorted(own - set(weights)), sorted(set(weights) - own)
        if missing or unexpected:
            raise ValueError(
                f"{path} does not match this student/heads: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}; the student architecture and teacher names "
                "must be the same as in the earlier stage"
            )
        self.load_state_dict(weights, strict=False)

    # -- distributed --------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``, shard the student (per block) and the heads (FSDP2).

        Teachers stay replicated and unsharded; normalizer statistics stay float64 buffers
        outside any mixed-precision policy (DESIGN.md, "Distributed rules").
        """
        if self._device_mesh is None:
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self.device_mesh["data_parallel"]
        bf16 = str(self.trainer.precision).startswith("bf16")
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
        )
        for block in self.student.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(self.student, mesh=mesh, mp_policy=policy)
        for heads in self.heads.values():
            for head in (heads.features, heads.summary):
                if head is not None:
                    fully_shard(head, mesh=mesh, mp_policy=policy)

    # -- optimization -------------------------------------------------------------------------
    def trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters of the student and heads (teachers are never optimized)."""
        yield from self.student.named_parameters(prefix="student")
        yield from self.heads.named_parameters(prefix="heads")

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The optimizer's parameter groups: trunk and heads apart, each with and without decay.

        Named ``trunk_decay``, ``trunk_no_decay`` (``student.*``) and ``heads_decay``,
        ``heads_no_decay`` (everything else); biases, norms, position embeddings and tokens
        get no weight decay. The trunk has groups of its own so that its optimizer state (e.g.
        timm ``Lamb``'s per-group step counter) can start afresh when ``FreezeBody`` releases
        it (PHI-S A.7) while the heads' state carries on.
        """
        groups: dict[str, list[nn.Parameter]] = {
            name: [] for name in ("trunk_decay", "trunk_no_decay", "heads_decay", "heads_no_decay")
        }
        for name, param in self.trainable_parameters():
            part = "trunk" if name.startswith("student.") else "heads"
            exempt = param.ndim < 2 or name.endswith(("pos_embed", "cls_token", "registers"))
            groups[f"{part}_{'no_decay' if exempt else 'decay'}"].append(param)
        return [
            {
                "params": params,
                "name": name,
                **({"weight_decay": 0.0} if "no_decay" in name else {}),
            }
            for name, params in groups.items()
            if params
        ]

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.optimizer_factory(self.parameter_groups())
        total = max(1, int(self.trainer.estimated_stepping_batches))
        schedule = LambdaLR(
            optimizer,
            lambda step: warmup_cosine(step, self.warmup_steps, total, self.min_lr_ratio),
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": schedule, "interval": "step", "name": "lr"},
        }

    # -- the step -------------------------------------------------------------------------
    def run_teachers(self, crop: Tensor) -> dict[str, TeacherOutput]:
        """Every frozen teacher on its own view of the crop ``[B, 3, S, S]``.

        The crop is resized once per distinct teacher resolution; each teacher then only
        normalizes it with its own mean/std (its view skips a resize to its own size).
        """
        resized: dict[int, Tensor] = {}
        outputs = {}
        for name, teacher in self.teachers.items():
            side = teacher.resolution
            if side not in resized:
                resized[side] = resize_view(crop, side)
            outputs[name] = teacher(resized[side])
        return outputs

    def normalized_targets(self, outputs: Mapping[str, TeacherOutput]) -> dict[str, Tensor]:
        """Teacher features in each normalizer's target space, ``{name: [B, H, W, C]}``.

        While statistics estimation is on, each normalizer first accumulates the batch and,
        on refit steps, recomputes its transform, so targets use the current estimate.
        """
        targets = {}
        for name, out in outputs.items():
            normalizer = self.normalizers[name]
            features = out.features.float()
            if self.estimate_statistics:
                normalizer.update(features)
            if self.refit_statistics:
                normalizer.fit()
            targets[name] = normalizer(features)
        return targets

    def match(
        self, crop: Tensor, outputs: Mapping[str, TeacherOutput], targets: Mapping[str, Tensor]
    ) -> dict[str, TeacherMatch]:
        """The student's prediction of every teacher, paired with that teacher's target.

        Runs the student once on its view of ``crop`` and each teacher's adaptor heads on its
        tokens; the predicted map is brought to the target's grid.
        """
        view = teacher_view(crop, self.student_resolution, self.student_mean, self.student_std)
        student = self.student(view)
        matches: dict[str, TeacherMatch] = {}
        for name, out in outputs.items():
            heads = self.heads[name]
            target = targets[name]
            summary = summary_target = None
            if heads.summary is not None and out.summary is not None:
                summary = heads.summary(student.summary[:, self.summary_token[name]])
                summary_target = out.summary.float()
            matches[name] = TeacherMatch(
                features=resize_features(heads.features(student.features), target.shape[1:3]),
                target=target,
                summary=summary,
                summary_target=summary_target,
            )
        return matches

    def distillation_losses(self, matches: Mapping[str, TeacherMatch]) -> dict[str, Tensor]:
        """Per-teacher feature and summary losses, keyed ``"<teacher>/feature_loss"`` etc."""
        losses: dict[str, Tensor] = {}
        for name, m in matches.items():
            losses[f"{name}/feature_loss"] = self.feature_loss(m.features, m.target)
            if m.summary is not None and m.summary_target is not None:
                losses[f"{name}/summary_loss"] = self.summary_loss(m.summary, m.summary_target)
        return losses

    def total_loss(self, losses: Mapping[str, Tensor]) -> Tensor:
        """Naive balancing (AM-RADIO 3.4.1): ``sum_k gamma_k L_feat,k + lambda_k L_sum,k``."""
        total = 0.0
        for key, value in losses.items():
            name, kind = key.split("/")
            weight = self.feature_weights if kind == "feature_loss" else self.summary_weights
            total = total + weight[name] * value
        return total  # type: ignore[return-value]

    def _shared_step(self, batch: Tensor, stage: str) -> Tensor:
        crop = as_float_images(batch)
        outputs = self.run_teachers(crop)
        targets = self.normalized_targets(outputs)
        matches = self.match(crop, outputs, targets)
        losses = self.distillation_losses(matches)
        loss = self.total_loss(losses)
        if stage == "train" and not self._logs_this_step():
            return loss
        sync = stage != "train"
        batch_size = crop.shape[0]
        self.log(f"{stage}/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=sync)
        self.log_dict(
            {f"{stage}/{k}": v.detach() for k, v in losses.items()},
            batch_size=batch_size,
            sync_dist=sync,
        )
        return loss

    def _logs_this_step(self) -> bool:
        """Whether to log this training step's metrics: the steps the logger writes
        (``log_every_n_steps``), plus the first and the last step of the run.

        Every ``self.log`` call costs host time (about 0.8 ms on a 2-core CPU: Lightning walks
        and deep-copies its result bookkeeping on each call, Lightning #20388) whether or not
        the logger writes the step, so training metrics are not logged on the other steps
        (``trainer.callback_metrics`` and the progress bar then hold the last logged values).
        """
        trainer = self._trainer
        if trainer is None:
            return True
        step, every = trainer.global_step, trainer.log_every_n_steps
        return step == 0 or step + 1 == trainer.max_steps or (every > 0 and (step + 1) % every == 0)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
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

    def predict_step(self, batch: Tensor, batch_idx: int) -> dict[str, TeacherOutput]:
        """The student's estimate of every teacher, in the teacher's original space.

        Returns ``{name: TeacherOutput(summary [B, C_s] | None, features [B, h, w, C])}``
        with features denormalized by the teacher's normalizer (PHI-S 2.2).
        """
        crop = as_float_images(batch)
        view = teacher_view(crop, self.student_resolution, self.student_mean, self.student_std)
        student = self.student(view)
        estimates = {}
        for name, heads in self.heads.items():
            features = self.normalizers[name].inverse(heads.features(student.features))
            summary = (
                heads.summary(student.summary[:, self.summary_token[name]])
                if heads.summary is not None
                else None
            )
            estimates[name] = TeacherOutput(summary=summary, features=features)
        return estimates
