"""TrainingProgressGuard: stop a run that trains nothing, at the first update that shows it.

A run can look healthy (finite losses, logs, checkpoints) while its optimizer changes nothing:
a parameter group with learning rate 0, a part of the student cut from the graph (a
``detach``, a ``no_grad``, a module whose output is not used), or, under FSDP2, backward
hooks that never fired (with torch <= 2.13 an unregistered dataclass output hid the student's
tensors from FSDP2: no gradient was reduce-scattered to the sharded parameters and the
optimizer skipped them all; :mod:`radio_lit.students.base`). Neither PyTorch nor Lightning
checks it. This guard does, parameter by parameter:

- at a parameter's first update (the heads' at the first step; the trunk's when
  :class:`~radio_lit.callbacks.FreezeBody` releases it, whichever groups hold them), it has a
  finite gradient that is not all zero, and its value changed (a gradient that is present but
  all zero may stay so for :data:`ZERO_GRADIENT_UPDATES` updates: the layers before a
  zero-initialized output layer get exactly zero gradients at its first update, and nonzero
  ones once it has moved);
- afterwards, every ``every_n_steps`` steps, every parameter still has a gradient that is not
  all zero (the same grace for an all-zero one, none for a missing one), and each group's
  update is still not zero: a cut that appears later (a windowed step, another resolution, a
  partition the first step did not draw) stops the run at the next such check. Whether the
  parameters move would not show it: momentum and weight decay keep moving them after their
  gradients stop.

What is not judged, as no lack of progress:

- the heads of a :class:`~radio_lit.DistillationModule` whose every loss weight is 0
  (``model.feature_weights`` / ``model.summary_weights``: an ablation that removes a term),
  said once in the log at the start of training ``[choice]``: they stay in the optimizer, with
  ``requires_grad`` untouched (DDP and FSDP2 fix the set of trained parameters when they wrap
  the model: DESIGN.md "Distributed rules"), and the checkpoint keeps its layout; their weights
  only decay (AdamW), their outputs are not trained;
- at one checked step, the heads whose every term had weight 0 in that step's total on every
  rank (:meth:`radio_lit.losses.Balancer.effective_weights`: a teacher that
  :class:`~radio_lit.losses.TeacherDropping` dropped for every image of the step); their zero
  gradients are neither judged nor counted;
- a first update at learning rate 0 whose group's next update has a rate above 0 (a warm-up
  that starts at 0): that first check moves to the next update;
- a step whose update was dropped: every gradient removed (``NonFiniteGuard`` skipping it), or
  skipped by fp16's ``GradScaler`` (its scale lowered by the step: the routine overflow of the
  first steps).

Under DDP and FSDP2 each rank measures its local shards and the ranks agree through one
all-reduce per checked step. Steps in between cost nothing on the device and no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from radio_lit.callbacks.freeze import FreezeBody
from radio_lit.core.errors import NoTrainingProgress
from radio_lit.module import DistillationModule

#: A group whose learning rate the schedule took below this fraction of its initial one (but
#: not to 0) is not asked to move: near the end of a cosine schedule to 0, an update can round
#: to nothing in float32.
ANNEALED = 1e-3
#: Updates during which a parameter's check accepts gradients that reached it but are all
#: zero (``[choice]``): a zero-initialized last layer (an output that starts at 0, as
#: FeatSharp's uncertainty net's) gives the layers before it zero gradients at its first
#: update only; a block that stochastic depth dropped for every image of a step has an all-zero
#: gradient in that step only. A missing gradient (not reached by the backward pass) fails at
#: once.
ZERO_GRADIENT_UPDATES = 3


@dataclass
class _Group:
    """One parameter group at a checked step: its name, the optimizer's group (its rate after
    the update is the next update's), its learning rate at this update and its initial one,
    its named parameters, per parameter whether its first update is judged, and the
    parameters' values before the update."""

    name: str
    group: dict[str, Any]
    lr: float
    initial_lr: float
    params: list[tuple[str, nn.Parameter]]
    first: list[bool]
    before: list[Tensor] = field(default_factory=list)


@dataclass
class _Check:
    """What one checked step measures: its groups and, under fp16, the ``GradScaler``'s scale
    before the update."""

    step: int
    optimizer: Optimizer
    groups: list[_Group]
    scale: float | None


class TrainingProgressGuard(Callback):
    """Stop the run, before it saves a checkpoint of the step, when an update trains nothing.

    At a parameter's first update (the heads at the first step; the trunk when ``FreezeBody``
    releases it) it must have a finite gradient that is not all zero and must change; every
    ``every_n_steps`` steps after that, every parameter must have a gradient that is not all
    zero and each updated group must change (module docstring: what is not judged). A failure
    raises :class:`~radio_lit.core.errors.NoTrainingProgress` (``radio-lit`` prints one line
    naming the first parameters, the step and the likely cause, and exits with status 2) from
    ``on_train_batch_end``, before Lightning's ``ModelCheckpoint`` saves that step.

    A checked step copies the local values of the parameters it checks before the update (a
    copy that lives only during the optimizer step), measures their gradients and changes in
    a few fused operations, all-reduces them in one collective and reads the result once;
    other steps cost nothing. A resumed run checks each parameter's first update again.

    Args:
        every_n_steps: steps between the checks that every parameter still gets a gradient
            and each group still moves (0: only each parameter's first update is checked).
    """

    def __init__(self, every_n_steps: int = 100) -> None:
        super().__init__()
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be non-negative, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._verified: set[int] = set()  # ids of the parameters whose first update passed
        self._zero_updates: dict[int, int] = {}  # checks that met only zero gradients
        self._check: _Check | None = None
        self._names: dict[int, str] = {}
        self._groups: dict[str, list[int]] = {}  # the checked parameters of each group
        self._trunk: set[int] = set()  # what a FreezeBody holds
        self._freezers: list[FreezeBody] = []
        self._excluded: set[int] = set()  # heads whose every loss weight is 0
        self._terms: list[tuple[str, set[int]]] = []  # each loss term and its head's parameters
        self._settled: bool | None = None  # every parameter verified, the trunk held or not

    @property
    def checked_groups(self) -> frozenset[str]:
        """The parameter groups every checked parameter of which has passed its first update
        in this fit."""
        return frozenset(n for n, ids in self._groups.items() if ids and self._verified >= set(ids))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every fit (a resumed one too) checks every first update. The parameters are
        named now, as the optimizer holds them: a module can register other tensors later
        (FSDP2 swaps in unsharded ones for its forward, and keeps them registered when its
        backward hooks do not fire)."""
        self._verified.clear()
        self._zero_updates.clear()
        self._settled = None
        self._names = {id(p): n for n, p in pl_module.named_parameters()}
        self._freezers = [c for c in trainer.callbacks if isinstance(c, FreezeBody)]
        module = pl_module if isinstance(pl_module, DistillationModule) else None
        student = module.student if module is not None and self._freezers else None
        self._trunk = set() if student is None else {id(p) for p in student.parameters()}
        self._terms = [] if module is None else _term_parameters(module)
        left_out = [key for key, _ in self._terms if module.balancer.terms[key] == 0]
        self._excluded = {i for key, ids in self._terms if key in left_out for i in ids}
        if left_out:
            heads = ", ".join(_head_name(key) for key in left_out)
            rank_zero_info(
                f"TrainingProgressGuard: {heads} left out of the check (every loss weight 0: "
                f"{', '.join(left_out)}); they stay in the optimizer, untrained"
            )
        self._groups = {
            _group_name(group, index): [
                id(p) for p in group["params"] if p.requires_grad and id(p) not in self._excluded
            ]
            for optimizer in trainer.optimizers
            for index, group in enumerate(optimizer.param_groups)
        }

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        step = trainer.global_step
        periodic = self.every_n_steps > 0 and step % self.every_n_steps == 0
        self._check = None
        holds = any(c.holds(step) for c in self._freezers)
        if not periodic and self._settled is holds:
            return  # nothing to check: no work, no copy, no synchronisation
        left_out = self._excluded | (self._trunk if holds else set())
        groups = []
        for index, group in enumerate(optimizer.param_groups):
            name = _group_name(group, index)
            params = [p for p in group["params"] if p.requires_grad and id(p) not in left_out]
            first = [id(p) not in self._verified for p in params]
            if not periodic:
                params = [p for p, new in zip(params, first, strict=True) if new]
                first = [True] * len(params)
            if params:
                lr = float(group.get("lr", 0.0))  # the update's (the schedule moves it after)
                named = [(self._names.get(id(p), f"{name}[{i}]"), p) for i, p in enumerate(params)]
                initial = float(group.get("initial_lr", lr))
                groups.append(_Group(name, group, lr, initial, named, first))
        if not groups:
            self._settled = holds
            return
        for group in groups:  # the values before the update (a copy of the local shards)
            group.before = torch._foreach_mul([_local(p) for _, p in group.params], 1.0)
        self._check = _Check(step, optimizer, groups, _scale(trainer))

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
        scale = _scale(trainer)
        if check.scale is not None and scale is not None and scale < check.scale:
            return  # fp16's GradScaler found an overflow and skipped the update (every rank)
        every = [p for group in check.groups for _, p in group.params]
        after = [_local(p) for p in every]
        before = [t for group in check.groups for t in group.before]
        grads = [
            _local(p.grad) if p.grad is not None else a.new_zeros(0)
            for p, a in zip(every, after, strict=True)
        ]
        # per parameter: gradient norm, change norm, 1 where the gradient is missing; then
        # each loss term's weight in this step's total
        device = trainer.strategy.root_device
        local = torch.cat(
            [
                _norms(grads, device),
                _norms(torch._foreach_sub(after, before), device),
                torch.tensor([float(p.grad is None) for p in every], device=device).double(),
                _term_weights(pl_module, self._terms, device),
            ]
        )
        reduced = trainer.strategy.reduce(local, reduce_op="sum").tolist()
        count = len(every)
        grad_norm, change, absent = (reduced[k * count : (k + 1) * count] for k in range(3))
        weights = zip(self._terms, reduced[3 * count :], strict=True)
        idle = {i for (_, ids), weight in weights if weight == 0 for i in ids}
        at = 0
        for group in check.groups:
            span = slice(at, at + len(group.params))
            at += len(group.params)
            problem, passed = self._judge(
                group, grad_norm[span], change[span], absent[span], idle, trainer
            )
            if problem:
                raise NoTrainingProgress(
                    f"no training progress at step {check.step}: {problem}. The run stopped "
                    "before saving a checkpoint of this step (TrainingProgressGuard)"
                )
            self._verified.update(passed)
        holds = any(c.holds(check.step + 1) for c in self._freezers)
        left_out = self._excluded | (self._trunk if holds else set())
        checked = {i for ids in self._groups.values() for i in ids} - left_out
        self._settled = holds if checked <= self._verified else None

    def _judge(
        self,
        group: _Group,
        grad_norm: Sequence[float],
        change: Sequence[float],
        absent: Sequence[float],
        idle: set[int],
        trainer: pl.Trainer,
    ) -> tuple[str, list[int]]:
        """Why ``group`` did not train at this step (``""`` when it did) and the ids of its
        parameters whose first update passed, from per parameter its gradient's norm, its
        change's norm and whether its gradient is missing (summed over the ranks); ``idle``:
        the parameters whose every loss term had weight 0 in this step (not judged)."""
        where = f"of parameter group {group.name!r}"
        names = [n for n, _ in group.params]
        lr, initial_lr = group.lr, group.initial_lr
        annealed = 0 < lr <= ANNEALED * initial_lr
        warming = lr == 0 and float(group.group.get("lr", 0.0)) > 0  # a warm-up from 0
        bad, unreached, zero, still, moved, passed = [], [], [], [], [], []
        for index, (name, param) in enumerate(group.params):
            key = id(param)
            if key in idle or (group.first[index] and warming):
                continue  # no term of this step reached it, or its first check moves on
            if absent[index] > 0:
                unreached.append(name)  # not reached at all: judged at once
                continue
            if group.first[index] and not math.isfinite(grad_norm[index]):
                bad.append(name)
                continue
            if grad_norm[index] == 0:
                waited = self._zero_updates.get(key, 0)
                if waited < ZERO_GRADIENT_UPDATES:  # judged again at the next updates
                    self._zero_updates[key] = waited + 1
                    self._verified.discard(key)
                    zero.append(name)  # named too if the group fails now
                else:
                    unreached.append(name)
                continue
            self._zero_updates.pop(key, None)
            if not group.first[index]:
                moved.append(change[index] > 0)  # a group's verified parameters: one moves
            elif change[index] > 0 or annealed:
                passed.append(key)
            else:
                still.append(name)
        count = f"of {len(names)} parameters {where}"
        if bad:
            return (
                f"{_listed(bad)} ({len(bad)} {count}) have non-finite gradients "
                "(radio_lit.callbacks.NonFiniteGuard names their cause)"
            ), passed
        if unreached:
            unreached = [n for n in names if n in unreached or n in zero]
            return (
                f"{_listed(unreached)} ({len(unreached)} {count}) got no gradient or an "
                "all-zero one: not reached by the backward pass (a part of the student cut "
                "from the graph: a detach, a no_grad, an output that is not used or is "
                "multiplied by 0; or every loss weight that reaches it 0: model.feature_weights"
                " / model.summary_weights) or, under FSDP2, backward hooks that did not fire "
                "(a student output type FSDP2 cannot see: register it as a pytree node, "
                "radio_lit.students.base)"
            ), passed
        if still:
            if lr == 0:
                cause = (
                    "the group's learning rate is 0 at this update and the next "
                    "(model.optimizer.init_args.lr, or the schedule's warm-up / min_lr_ratio)"
                )
            else:
                cause = "the optimizer skipped them; likely causes: " + _CAUSES
            return f"{_listed(still)} ({len(still)} {count}) did not change: {cause}", passed
        if moved and not any(moved) and not annealed:
            return (
                f"the parameters {where} ({_listed(names)}) stopped changing"
                + (" (learning rate 0)" if lr == 0 else "")
                + "; likely causes: "
                + _CAUSES
            ), passed
        return "", passed


_CAUSES = (
    "a parameter group with learning rate 0, parameters not reached by the backward pass, "
    "FSDP2 backward hooks that did not fire"
)


def _term_parameters(module: DistillationModule) -> list[tuple[str, set[int]]]:
    """Each loss term ``"<teacher>/<term>"`` of the module's balancer and the ids of the
    parameters of the head it alone trains (``heads.<teacher>.features`` or ``.summary``)."""
    terms = []
    for key in module.balancer.terms:
        teacher, term = key.split("/")
        head = getattr(module.heads[teacher], _HEADS[term])
        if head is not None:
            terms.append((key, {id(p) for p in head.parameters()}))
    return terms


#: The head that each kind of loss term trains (radio_lit.training.per_teacher.loss_terms).
_HEADS = {"feature_loss": "features", "summary_loss": "summary"}


def _term_weights(
    pl_module: pl.LightningModule, terms: Sequence[tuple[str, set[int]]], device: torch.device
) -> Tensor:
    """``[T]`` float64: each of ``terms``' absolute weight in the last total of the module's
    balancer (:meth:`~radio_lit.losses.Balancer.effective_weights`); empty without terms."""
    if not terms:
        return torch.zeros(0, dtype=torch.float64, device=device)
    weights = pl_module.balancer.effective_weights()  # type: ignore[union-attr]
    found = [torch.as_tensor(weights[key]) for key, _ in terms]
    found = [w.full_tensor() if isinstance(w, DTensor) else w for w in found]
    return torch.stack([w.to(device, torch.float64).reshape(()) for w in found]).abs()


def _head_name(key: str) -> str:
    teacher, term = key.split("/")
    return f"heads.{teacher}.{_HEADS[term]}"


def _group_name(group: dict[str, Any], index: int) -> str:
    return str(group.get("name", f"param_groups[{index}]"))


def _scale(trainer: pl.Trainer) -> float | None:
    """The fp16 ``GradScaler``'s scale (``None`` without one): it lowers its scale after an
    update that it skipped for an overflow, on every rank alike."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return None if scaler is None or not scaler.is_enabled() else float(scaler.get_scale())


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
