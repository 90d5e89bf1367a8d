"""TrainingProgressGuard: stop a run that trains nothing, at the first update that shows it.

A run can look healthy (finite losses, logs, checkpoints) while its optimizer changes nothing:
a parameter group with learning rate 0, a part of the student cut from the graph (a
``detach``, a ``no_grad``, a module whose output is not used), or, under FSDP2, backward
hooks that never fired (with torch <= 2.13 an unregistered dataclass output hid the student's
tensors from FSDP2: no gradient was reduce-scattered to the sharded parameters and the
optimizer skipped them all; :mod:`radio_lit.students.base`). Neither PyTorch nor Lightning
checks it. This guard does:

- at the first optimizer step that updates a parameter group (a group of the trunk only when
  :class:`~radio_lit.callbacks.FreezeBody` has released it), every trainable parameter of
  the group has a finite gradient that is not all zero, and its value changed (a gradient
  that is present but all zero may stay so for :data:`ZERO_GRADIENT_UPDATES` updates: the
  layers before a zero-initialized output layer get exactly zero gradients at its first
  update, and nonzero ones once it has moved);
- afterwards, every ``every_n_steps`` steps, each group's update is still not zero.

Under DDP and FSDP2 each rank measures its local shards and the ranks agree through one
all-reduce per checked step. Steps in between cost nothing on the device and no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from radio_lit.callbacks._common import distillation_module
from radio_lit.callbacks.freeze import FreezeBody
from radio_lit.core.errors import NoTrainingProgress

#: A group whose learning rate the schedule took below this fraction of its initial one (but
#: not to 0) is not asked to move: near the end of a cosine schedule to 0, an update can round
#: to nothing in float32.
ANNEALED = 1e-3
#: Updates during which a group's first check accepts gradients that reached a parameter but
#: are all zero (``[choice]``): a zero-initialized last layer (an output that starts at 0, as
#: FeatSharp's uncertainty net's) gives the layers before it zero gradients at its first
#: update only. A missing gradient (not reached by the backward pass) fails at once.
ZERO_GRADIENT_UPDATES = 3


@dataclass
class _Check:
    """What one checked step measures: per group its name, its learning rate at this update
    and its initial one, its parameters and whether it is its first update (then every
    parameter is judged), and the parameters' values before the update."""

    step: int
    optimizer: Optimizer
    groups: list[tuple[str, tuple[float, float], list[tuple[str, nn.Parameter]], bool]]
    before: list[list[Tensor]]


class TrainingProgressGuard(Callback):
    """Stop the run, before it saves a checkpoint of the step, when an update trains nothing.

    At the first optimizer step that updates a parameter group (the heads at the first step;
    the trunk when ``FreezeBody`` releases it), every trainable parameter of the group must
    have a finite gradient that is not all zero and must change; every ``every_n_steps``
    steps after that, each updated group must change. A failure raises
    :class:`~radio_lit.core.errors.NoTrainingProgress` (``radio-lit`` prints one line naming
    the first parameters, the step and the likely cause, and exits with status 2) from
    ``on_train_batch_end``, before Lightning's ``ModelCheckpoint`` saves that step.

    A checked step copies the local values of the parameters it checks before the update (a
    copy that lives only during the optimizer step), measures their gradients and changes in
    a few fused operations, all-reduces them in one collective and reads the result once;
    other steps cost nothing. A step whose gradients were all dropped (``NonFiniteGuard``
    skipping it) is not judged. A resumed run checks each group's first update again.

    Args:
        every_n_steps: steps between the checks that each group still moves (0: only the
            first update of each group is checked).
    """

    def __init__(self, every_n_steps: int = 100) -> None:
        super().__init__()
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be non-negative, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._verified: set[str] = set()
        self._check: _Check | None = None
        self._names: dict[int, str] = {}
        self._trunk: set[int] = set()  # what a FreezeBody holds
        self._zero_updates: dict[str, int] = {}  # first checks that met only zero gradients

    @property
    def checked_groups(self) -> frozenset[str]:
        """The parameter groups whose first update this fit has checked."""
        return frozenset(self._verified)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every fit (a resumed one too) checks every first update. The parameters are
        named now, as the optimizer holds them: a module can register other tensors later
        (FSDP2 swaps in unsharded ones for its forward, and keeps them registered when its
        backward hooks do not fire)."""
        self._verified.clear()
        self._zero_updates.clear()
        self._names = {id(p): n for n, p in pl_module.named_parameters()}
        student = distillation_module(pl_module).student if _freezes(trainer) else None
        self._trunk = set() if student is None else {id(p) for p in student.parameters()}

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        step = trainer.global_step
        periodic = self.every_n_steps > 0 and step % self.every_n_steps == 0
        self._check = None
        if not periodic and len(self._verified) == len(optimizer.param_groups):
            return  # nothing to check: no work, no copy, no synchronisation
        holds = any(isinstance(c, FreezeBody) and c.holds(step) for c in trainer.callbacks)
        frozen = self._trunk if holds else set()
        groups = []
        for index, group in enumerate(optimizer.param_groups):
            name = str(group.get("name", f"param_groups[{index}]"))
            first = name not in self._verified
            params = [p for p in group["params"] if p.requires_grad and id(p) not in frozen]
            if params and (first or periodic):
                lr = float(group.get("lr", 0.0))  # the update's (the schedule moves it after)
                groups.append((name, (lr, float(group.get("initial_lr", lr))), params, first))
        if groups:  # named, with their values before the update (a copy of the local shards)
            names = self._names
            groups = [
                (name, lrs, [(names.get(id(p), f"{name}[{i}]"), p) for i, p in enumerate(ps)], new)
                for name, lrs, ps, new in groups
            ]
            before = [torch._foreach_mul([_local(p) for _, p in ps], 1.0) for *_, ps, _ in groups]
            self._check = _Check(step, optimizer, groups, before)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        check, self._check = self._check, None
        if check is None:
            return
        if all(p.grad is None for p in optimizer_params(check.optimizer)):
            return  # the whole update was dropped on every rank (NonFiniteGuard skipped it)
        every = [p for *_, params, _ in check.groups for _, p in params]
        after = [_local(p) for p in every]
        before = [t for ts in check.before for t in ts]
        grads = [
            _local(p.grad) if p.grad is not None else a.new_zeros(0)
            for p, a in zip(every, after, strict=True)
        ]
        # per parameter: gradient norm, change norm, 1 where the gradient is missing
        device = trainer.strategy.root_device
        local = torch.stack(
            [
                _norms(grads, device),
                _norms(torch._foreach_sub(after, before), device),
                torch.tensor([float(p.grad is None) for p in every], device=device).double(),
            ]
        )
        grad_norm, change, absent = trainer.strategy.reduce(local, reduce_op="sum").tolist()
        at = 0
        for name, lrs, params, first in check.groups:
            span = slice(at, at + len(params))
            at += len(params)
            zero = [g == 0 and a == 0 for g, a in zip(grad_norm[span], absent[span], strict=True)]
            missing = any(a > 0 for a in absent[span])  # not reached at all: judged at once
            waited = self._zero_updates.get(name, 0)
            if first and any(zero) and not missing and waited < ZERO_GRADIENT_UPDATES:
                self._zero_updates[name] = self._zero_updates.get(name, 0) + 1
                continue  # judged again at the next update (ZERO_GRADIENT_UPDATES)
            problem = _problem(
                name,
                lrs,
                [n for n, _ in params],
                grad_norm[span],
                change[span],
                absent[span],
                first,
            )
            if problem:
                raise NoTrainingProgress(
                    f"no training progress at step {check.step}: {problem}. The run stopped "
                    "before saving a checkpoint of this step (TrainingProgressGuard)"
                )
            self._verified.add(name)


def _problem(
    group_name: str,
    lrs: tuple[float, float],
    names: Sequence[str],
    grad_norm: Sequence[float],
    change: Sequence[float],
    absent: Sequence[float],
    first: bool,
) -> str:
    """Why group ``group_name`` did not train at this step, first cause first; ``""`` when
    it did, from the group's learning rates ``(at this update, initial)`` and per parameter
    its gradient's norm, its change's norm and whether its gradient is missing (summed over
    the ranks). At its first update every parameter is judged; later the group as a whole."""
    where = f"of parameter group {group_name!r}"
    lr, initial_lr = lrs
    annealed = 0 < lr <= ANNEALED * initial_lr
    if not first:
        if any(c > 0 for c in change) or annealed:
            return ""
        return (
            f"the parameters {where} ({_listed(names)}) stopped changing"
            + (" (learning rate 0)" if lr == 0 else "")
            + "; likely causes: "
            + _CAUSES
        )
    bad = [n for n, g in zip(names, grad_norm, strict=True) if not math.isfinite(g)]
    if bad:
        return (
            f"{_listed(bad)} ({len(bad)} of {len(names)} parameters {where}) have non-finite "
            "gradients (radio_lit.callbacks.NonFiniteGuard names their cause)"
        )
    stats = zip(names, grad_norm, absent, strict=True)
    unreached = [n for n, g, a in stats if a > 0 or g == 0]
    if unreached:
        return (
            f"{_listed(unreached)} ({len(unreached)} of {len(names)} parameters {where}) got "
            "no gradient or an all-zero one: not reached by the backward pass (a part of the "
            "student cut from the graph: a detach, a no_grad, an output that is not used or "
            "is multiplied by 0) or, under FSDP2, backward hooks that did not fire (a student "
            "output type FSDP2 cannot see: register it as a pytree node, "
            "radio_lit.students.base)"
        )
    still = [n for n, c in zip(names, change, strict=True) if c == 0]
    if not still or annealed:
        return ""
    if lr == 0:
        cause = (
            "the group's learning rate is 0 (model.optimizer.init_args.lr, or the schedule's "
            "warm-up / min_lr_ratio)"
        )
    else:
        cause = "the optimizer skipped them; likely causes: " + _CAUSES
    listed = f"{_listed(still)} ({len(still)} of {len(names)} parameters {where})"
    return f"{listed} did not change: {cause}"


_CAUSES = (
    "a parameter group with learning rate 0, parameters not reached by the backward pass, "
    "FSDP2 backward hooks that did not fire"
)


def _freezes(trainer: pl.Trainer) -> bool:
    return any(isinstance(c, FreezeBody) for c in trainer.callbacks)


def _local(tensor: Tensor) -> Tensor:
    """This rank's shard of a sharded tensor (FSDP2's ``DTensor``), else ``tensor``."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor.detach()


def optimizer_params(optimizer: Optimizer) -> Iterable[Tensor]:
    return (p for group in optimizer.param_groups for p in group["params"])


def _norms(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    """``[N]`` float64 2-norms of ``tensors`` on ``device``: one fused ``torch._foreach_norm``
    per (device, dtype) of the tensors."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, tensor in enumerate(tensors):
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    norms = torch.empty(len(tensors), dtype=torch.float64, device=device)
    for indices in groups.values():
        found = torch.stack(torch._foreach_norm([tensors[i] for i in indices]))
        norms[torch.tensor(indices, device=device)] = found.to(device, torch.float64)
    return norms


def _listed(names: Sequence[str], limit: int = 3) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
