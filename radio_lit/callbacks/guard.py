"""NonFiniteGuard: stop a diverging run before it corrupts its weights or its checkpoints.

A NaN or Inf gradient stops the run (or, if allowed, skips the update), with a message that
names the step and what went bad first: a teacher whose features are non-finite (a broken
weights file), a teacher's normalizer statistics, the weights, or the loss terms
(``<teacher>/feature_loss``, ``<teacher>/summary_loss``). A checkpoint whose weights or
statistics are non-finite is never written, so the last good checkpoint stays the last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from radio_lit.callbacks._common import distillation_module
from radio_lit.core.errors import TrainingStopped
from radio_lit.data.views import as_float_images
from radio_lit.module import DistillationModule
from radio_lit.training.batch import student_pixels


@torch.no_grad()
def finite_flag(tensors: Iterable[Tensor]) -> Tensor | None:
    """``1.0`` on the tensors' device when every element of ``tensors`` is finite, else ``0.0``:
    a few fused operations whatever the number of tensors, nothing read on the host; ``None``
    without floating-point tensors.

    The 2-norm of the per-tensor norms is NaN or Inf as soon as one element is. One
    ``torch._foreach_norm`` per (device, dtype) group (its fused multi-tensor kernel needs one
    dtype), a sharded tensor (FSDP2's ``DTensor``) through its local shard, read in place.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for tensor in tensors:
        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        if local.is_floating_point():
            groups.setdefault((local.device, local.dtype), []).append(local)
    if not groups:
        return None
    norms = [norm for group in groups.values() for norm in torch._foreach_norm(group)]
    device = norms[0].device  # one device unless the tensors are spread over several
    norms = [norm if norm.device == device else norm.to(device) for norm in norms]
    stacked = torch.stack(norms)  # float64 when a tensor is (statistics), else float32
    wide = torch.float64 if stacked.dtype == torch.float64 else torch.float32
    total = torch.linalg.vector_norm(stacked, dtype=wide)
    return torch.isfinite(total).float()


def all_ranks_finite(trainer: pl.Trainer, tensors: Iterable[Tensor]) -> bool:
    """Whether every rank's ``tensors`` are finite: each rank's :func:`finite_flag` reduced
    by their minimum on the device, then read once. That read is the guard's one host-device
    synchronisation per step on any number of ranks (Lightning's ``reduce_boolean_decision``
    of a host ``bool`` would add two: a host-to-device copy and a second read)."""
    flag = finite_flag(tensors)
    if flag is None:
        flag = torch.ones((), device=trainer.strategy.root_device)
    return bool(trainer.strategy.reduce(flag, reduce_op="min").item())


def non_finite(named: Iterable[tuple[str, Tensor | None]]) -> list[str]:
    """Names of the tensors holding a NaN or Inf (``None`` entries are skipped)."""
    return [
        name
        for name, value in named
        if value is not None
        and value.is_floating_point()
        and not bool(torch.isfinite(value.detach()).all())
    ]


class NonFiniteGuard(Callback):
    """Check every optimizer step's gradients; stop on NaN / Inf with the cause.

    Good steps cost one fused finiteness check of all gradients and one host-device
    synchronisation, its read (:func:`all_ranks_finite`): the update cannot be applied before
    the guard knows the gradients are finite, so this read is the one the step keeps. On a bad
    step the guard finds the cause by re-running the step's pieces without gradients, then
    either skips the update (at most ``max_skipped_steps`` times in a run; counted, logged as
    ``train/skipped_steps`` and checkpointed) or raises
    :class:`~radio_lit.core.errors.TrainingStopped` (``radio-lit`` exits with status 1). Checkpoints
    are checked before they are written: non-finite weights or statistics stop the run instead.

    Args:
        max_skipped_steps: isolated bad steps whose update is dropped instead of stopping the
            run (0: the first bad step stops it).
    """

    def __init__(self, max_skipped_steps: int = 0) -> None:
        super().__init__()
        if max_skipped_steps < 0:
            raise ValueError(f"max_skipped_steps must be non-negative, got {max_skipped_steps}")
        self.max_skipped_steps = max_skipped_steps
        self.skipped_steps = 0
        self._batch: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict["skipped_steps"])

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch = batch  # kept only to find the cause of a bad step

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        module = distillation_module(pl_module)
        params = [p for _, p in module.trainable_parameters()]
        # every rank stops (or skips) together, also when only its shard went bad (FSDP)
        if all_ranks_finite(trainer, (p.grad for p in params if p.grad is not None)):
            return
        cause = diagnose(module, self._batch)
        step = trainer.global_step
        if self.skipped_steps < self.max_skipped_steps:
            self.skipped_steps += 1
            for param in params:
                param.grad = None  # no update from this step
            module.log("train/skipped_steps", float(self.skipped_steps), on_step=True)
            return
        allowed = (
            f" after {self.skipped_steps} skipped step(s) (max_skipped_steps="
            f"{self.max_skipped_steps})"
            if self.max_skipped_steps
            else ""
        )
        raise TrainingStopped(
            f"non-finite gradients at step {step}{allowed}: {cause}. The run stopped before "
            "applying this update; the last checkpoint holds the last good state. Lower "
            "model.optimizer.init_args.lr or check the named teacher's weights, then resume "
            "with --ckpt_path."
        )

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        state = checkpoint["state_dict"]
        # Every rank runs this hook: one fused check and one reduction on any number of
        # tensors (a per-tensor check of a sharded FSDP2 state is a collective per tensor);
        # the values are named one by one only when it fails (then every rank does).
        if all_ranks_finite(trainer, (v for v in state.values() if isinstance(v, Tensor))):
            return
        bad = non_finite(state.items())
        if bad:
            raise TrainingStopped(
                f"step {trainer.global_step}: refusing to write a checkpoint with non-finite "
                f"values in {_listed(bad)}; the last checkpoint holds the last good state"
            )


@torch.no_grad()
def diagnose(module: DistillationModule, batch: Any) -> str:
    """What made a step non-finite, first cause first (re-runs the step without gradients).

    Every rank runs the same pieces whatever it finds, so the student's forward (collective
    under FSDP) runs on all ranks alike.
    """
    statistics = non_finite(
        (f"{name} ({key})", value)
        for name, normalizer in module.normalizers.items()
        for key, value in normalizer.state_dict().items()
    )
    weights = non_finite(module.trainable_parameters())
    teachers: list[str] = []
    terms: list[str] = []
    losses: dict[str, Tensor] = {}
    if batch is not None:
        crop = as_float_images(student_pixels(batch))
        outputs = module.run_teachers(crop)
        teachers = non_finite(
            (f"{name}.{part}", getattr(out, part))
            for name, out in outputs.items()
            for part in ("features", "summary")
        )
        targets = {n: module.normalizers[n](out.features.float()) for n, out in outputs.items()}
        losses = module.distillation_losses(module.match(crop, outputs, targets))
        terms = non_finite(losses.items())
    if teachers:
        return (
            f"teacher output(s) {_listed(teachers)} are non-finite: that teacher's weights "
            "file is broken or its input overflows"
        )
    if statistics:
        return f"the normalizer statistics of teacher(s) {_listed(statistics)} are non-finite"
    if weights:
        return f"the weights {_listed(weights)} are non-finite (the learning rate is too high?)"
    if terms:
        return f"the loss term(s) {_listed(terms)} are non-finite ({_values(losses, terms)})"
    grads = non_finite((name, p.grad) for name, p in module.trainable_parameters())
    if grads:
        return f"the loss is finite but the gradients of {_listed(grads)} are not (overflow?)"
    return "another rank's gradients are non-finite"


def _listed(names: list[str], limit: int = 5) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _values(losses: Mapping[str, Tensor], names: list[str]) -> str:
    return ", ".join(f"{name}={losses[name].item()}" for name in names[:5])
