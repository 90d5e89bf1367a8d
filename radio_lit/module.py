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

import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from radio_lit.data.views import as_float_images, resize_view, teacher_view
from radio_lit.export import module_inference_model
from radio_lit.grid import GridPolicy, check_policies, loss_grid, resample
from radio_lit.losses import MSE, BalancerFactory, Cosine, Weighted
from radio_lit.metrics import DistillationMetrics
from radio_lit.normalizers import Identity, Normalizer
from radio_lit.partitions import Chunk, Partition, PartitionPlan
from radio_lit.students import CPEViT, ERadio, TeacherHeads, shard_student
from radio_lit.students.spectral_reparam import SPECTRAL_SCALE, request_power_iteration
from radio_lit.teachers import Teacher, TeacherOutput

NormalizerFactory = Callable[[int], Normalizer]

# Teachers are frozen and in eval mode by design (radio_lit.teachers.Teacher.train).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")

log = logging.getLogger(__name__)

_TEACHERS_PREFIX = "teachers."
_STUDENT_PREFIXES = ("student.", "heads.")


def weight_decayed(name: str, param: Tensor) -> bool:
    """Whether the optimizer decays parameter ``name``: matrices do; biases, norms, position
    embeddings and tokens (CLS, registers, E-RADIO's summary queries ``latent``) do not;
    σReparam scales always do, whatever their shape, so that spectral norms stay small (PHI-S
    A.7)."""
    if name.endswith(SPECTRAL_SCALE):
        return True
    tokens = ("pos_embed", "cls_token", "registers", "latent")
    return param.ndim >= 2 and not name.endswith(tokens)


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


def summary_token_slots(has_summary: Mapping[str, bool], num_tokens: int) -> dict[str, int]:
    """Teacher name -> index of the student summary token its summary head reads.

    ``num_tokens`` is 1 (shared token), the number of teachers with a summary (the k-th of
    them reads token k), or the number of teachers (teacher i reads token i: NVlabs/RADIO's
    ``cls_token_per_teacher`` layout, where a teacher without summary, such as SAM, leaves its
    token unused). Teachers without a summary get no entry.
    """
    names = list(has_summary)
    with_summary = [n for n in names if has_summary[n]]
    if num_tokens == 1:
        return dict.fromkeys(with_summary, 0)
    if num_tokens == len(with_summary):
        return {n: i for i, n in enumerate(with_summary)}
    if num_tokens == len(names):
        return {n: names.index(n) for n in with_summary}
    raise ValueError(
        f"the student has {num_tokens} summary tokens for {len(names)} teachers, "
        f"{len(with_summary)} of them with a summary ({with_summary}); set "
        f"model.student.init_args.num_cls_tokens to 1 (shared), {len(with_summary)} (one per "
        f"summary teacher) or {len(names)} (one per teacher, NVlabs/RADIO's layout)"
    )


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, then cosine annealing to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class DistillationModule(pl.LightningModule):
    """Label-free multi-teacher distillation of one student for one training stage.

    Args:
        student: the student backbone (a :class:`~radio_lit.students.CPEViT` or an
            :class:`~radio_lit.students.ERadio`).
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
        student: CPEViT | ERadio,
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
        optimizer: OptimizerCallable = _adamw,
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
                "balancer",
                "optimizer",
                "partitions",
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
        self.student_mean = tuple(student_mean or student.pixel_mean)
        self.student_std = tuple(student_std or student.pixel_std)
        self.feature_loss = loss if loss is not None else MSE()
        self.summary_loss = summary_loss if summary_loss is not None else Cosine()
        self.feature_weights = self._per_teacher(feature_weights, "feature_weights")
        self.summary_weights = self._per_teacher(summary_weights, "summary_weights")
        self.balancer = balancer(self._loss_terms())
        self.balancer.check_losses(self.feature_loss, self.summary_loss)
        self.metrics = nn.ModuleDict({s: DistillationMetrics(teachers) for s in ("val", "test")})
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
        self.grid_policies = check_policies(
            grid_policy,
            self._check_names(grid_policy_overrides or {}, "grid_policy_overrides"),
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

    def _loss_terms(self) -> dict[str, float]:
        """Every loss term ``"<teacher>/<term>"`` with its fixed weight, for the balancer."""
        terms = {}
        for name, teacher in self.teachers.items():
            terms[f"{name}/feature_loss"] = self.feature_weights[name]
            if teacher.summary_dim is not None:
                terms[f"{name}/summary_loss"] = self.summary_weights[name]
        return terms

    def _assign_summary_tokens(self) -> dict[str, int]:
        """Teacher name -> index of the student summary token its summary head reads."""
        has_summary = {n: t.summary_dim is not None for n, t in self.teachers.items()}
        return summary_token_slots(has_summary, self.student.num_cls_tokens)

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
        # A teacher new in this stage (AM-RADIO 4: SAM joins in stage 2) has no heads in the
        # earlier stage's checkpoint: its heads start fresh.
        new = [n for n in self.heads if not any(k.startswith(f"heads.{n}.") for k in weights)]
        fresh = {k for k in own if k.startswith(tuple(f"heads.{n}." for n in new))}
        missing, unexpected = sorted(own - set(weights) - fresh), sorted(set(weights) - own)
        if missing or unexpected:
            raise ValueError(
                f"{path} does not match this student/heads: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}; the student architecture and teacher names "
                "must be the same as in the earlier stage (teachers may only be added)"
            )
        if new:
            log.info("model.init_from: heads of teachers new in this stage start fresh: %s", new)
        self.load_state_dict(weights, strict=False)

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
        if self._device_mesh is None:
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self.device_mesh["data_parallel"]
        bf16 = str(self.trainer.precision).startswith("bf16")
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
        )
        shard_student(self.student, mesh, policy)
        for heads in self.heads.values():
            for head in (heads.features, heads.summary):
                if head is not None:
                    fully_shard(head, mesh=mesh, mp_policy=policy)
        if any(True for _ in self.balancer.parameters()):  # learned balance (Uncertainty):
            fully_shard(self.balancer, mesh=mesh)  # float32, gradients reduced over ranks

    # -- optimization -------------------------------------------------------------------------
    def trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters of the student, heads and balancer (teachers are never optimized)."""
        yield from self.student.named_parameters(prefix="student")
        yield from self.heads.named_parameters(prefix="heads")
        yield from self.balancer.named_parameters(prefix="balancer")

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
            groups[f"{part}_{'decay' if weight_decayed(name, param) else 'no_decay'}"].append(param)
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
    def run_teachers(
        self,
        crop: Tensor,
        teachers: tuple[str, ...] | None = None,
        student_resolution: tuple[int, int] | None = None,
    ) -> dict[str, TeacherOutput]:
        """Frozen teachers (default: all) on their own views of the crop ``[B, 3, S, S]``.

        Each teacher sees its native resolution, or the student's grid if it follows the
        student (``student_resolution``, default ``model.student_resolution``). The crop is
        resized once per distinct view size; each teacher then only normalizes it.
        Features stay on each teacher's own grid.
        """
        grid = self._student_grid(student_resolution)
        resized: dict[tuple[int, int], Tensor] = {}
        outputs = {}
        for name in teachers or tuple(self.teachers):
            teacher = self.teachers[name]
            size = teacher.view_size(grid)
            if size not in resized:
                resized[size] = resize_view(crop, size)
            outputs[name] = teacher(resized[size], size)
        return outputs

    def _student_grid(self, resolution: tuple[int, int] | None) -> tuple[int, int]:
        height, width = resolution or self.student_resolution
        return height // self.student.patch_size, width // self.student.patch_size

    def on_loss_grid(
        self, outputs: Mapping[str, TeacherOutput], student_resolution: tuple[int, int] | None
    ) -> dict[str, TeacherOutput]:
        """Teacher outputs with features moved to each teacher's loss grid (grid policy;
        shrinking antialiased, :func:`radio_lit.grid.resample`), ``{name: [B, H, W, C]}``."""
        grid = self._student_grid(student_resolution)
        moved = {}
        for name, out in outputs.items():
            teacher = self.teachers[name]
            size = loss_grid(
                self.grid_policies[name], grid, out.features.shape[1:3], teacher.interpolatable
            )
            moved[name] = TeacherOutput(out.summary, resample(out.features, size))
        return moved

    def normalized_targets(
        self, outputs: Sequence[Mapping[str, TeacherOutput]]
    ) -> list[dict[str, Tensor]]:
        """Teacher features in each normalizer's target space, one dict per chunk of the step
        (``[{name: [B, H, W, C]}]``), features already on the loss grid.

        While statistics estimation is on, each normalizer first accumulates, in one update,
        every feature of its teacher in this step (the chunks of this rank; the ranks of its
        process group) and, on refit steps, recomputes its transform, so targets use the
        current estimate; ranks that do not run a teacher then receive its state.
        """
        if self.estimate_statistics or self.refit_statistics:
            for name, normalizer in self.normalizers.items():
                rows = [
                    o[name].features.float().reshape(-1, normalizer.dim)
                    for o in outputs
                    if name in o
                ]
                if not rows:
                    continue
                if self.estimate_statistics:
                    normalizer.update(torch.cat(rows))
                if self.refit_statistics:
                    normalizer.fit()
            if self.refit_statistics:
                for name, source in self.partitions.sources.items():
                    self.normalizers[name].broadcast_state(source)
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
        """The student's prediction of every teacher, paired with that teacher's target.

        Runs the student once on its view of ``crop`` (``student_resolution``, default
        ``model.student_resolution``) and each teacher's adaptor heads on its tokens; the
        predicted map is brought to the target's grid (the loss grid).
        """
        size = student_resolution or self.student_resolution
        view = teacher_view(crop, size, self.student_mean, self.student_std)
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
                features=resample(heads.features(student.features), target.shape[1:3]),
                target=target,
                summary=summary,
                summary_target=summary_target,
            )
        return matches

    def distillation_losses(
        self, matches: Mapping[str, TeacherMatch], per_sample: bool = False
    ) -> dict[str, Tensor]:
        """Per-teacher feature and summary losses, keyed ``"<teacher>/feature_loss"`` etc.

        Scalars, or ``[B]`` per image with ``per_sample`` (for the balancer).
        """
        kwargs = {"per_sample": True} if per_sample else {}
        losses: dict[str, Tensor] = {}
        for name, m in matches.items():
            losses[f"{name}/feature_loss"] = self.feature_loss(m.features, m.target, **kwargs)
            if m.summary is not None and m.summary_target is not None:
                losses[f"{name}/summary_loss"] = self.summary_loss(
                    m.summary, m.summary_target, **kwargs
                )
        return losses

    def _shared_step(self, batch: Tensor, stage: str) -> Tensor:
        crop = as_float_images(batch)
        chunks = self.partitions.chunks(crop, train=stage == "train")
        outputs = [
            self.on_loss_grid(self.run_teachers(c.crop, c.teachers, c.resolution), c.resolution)
            for c in chunks
        ]
        targets = self.normalized_targets(outputs)
        loss, losses = self._idle_heads_term(stage), {}
        for chunk, out, target in zip(chunks, outputs, targets, strict=True):
            matches = self.match(chunk.crop, out, target, chunk.resolution)
            terms = self.distillation_losses(matches, per_sample=self.balancer.per_sample)
            loss = loss + chunk.weight * self.balancer(terms)
            losses.update(self._chunk_keys(chunk, terms, len(chunks)))
            if stage != "train":
                self.metrics[stage].update(matches, self.normalizers)
        if stage == "train" and not self._logs_this_step():
            return loss
        sync = stage != "train"
        batch_size = crop.shape[0]
        self.log(f"{stage}/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=sync)
        logged = {f"{stage}/{k}": v.detach().mean() for k, v in losses.items()}
        if stage == "train":
            weights = self.balancer.effective_weights()
            logged.update({f"train/balancer/{k}": w for k, w in weights.items()})
        self.log_dict(logged, batch_size=batch_size, sync_dist=sync)
        return loss

    def _idle_heads_term(self, stage: str) -> Tensor:
        """``0 x`` the heads of teachers this rank does not run in training (partitions), so
        every rank's backward reaches every head and DDP finds no unused parameter (their
        gradient here is zero; DDP's average then gives the update of
        :mod:`radio_lit.partitions`)."""
        idle = self.partitions.idle_teachers() if stage == "train" else []
        zero = torch.zeros((), device=self.device)
        for name in idle:
            probe = torch.zeros(1, self.student.embed_dim, device=self.device)
            for head in (self.heads[name].features, self.heads[name].summary):
                if head is not None:
                    zero = zero + 0.0 * head(probe).sum()
        return zero

    @staticmethod
    def _chunk_keys(chunk: Chunk, terms: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        """Loss terms for logging: ``<teacher>/<term>``, prefixed by the partition's name when
        the step has several chunks (a teacher may be in more than one)."""
        return terms if count == 1 else {f"{chunk.partition}/{k}": v for k, v in terms.items()}

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
