"""The optimizer policy: parameter groups, the weight-decay rule and the LR schedule.

What ``DistillationModule.configure_optimizers`` calls (AM-RADIO 4: AdamW, LR 1e-3; PHI-S A.7:
σReparam scales are decayed; RADIOv2.5 and PHI-S: linear warm-up then cosine annealing).
Pure functions of named parameters, as timm's ``param_groups_weight_decay``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import timm.optim
import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from radio_lit.students.spectral_reparam import SPECTRAL_SCALE
from radio_lit.training.lamb import Lamb

__all__ = [
    "adamw",
    "fastest_implementation",
    "optimizer_and_schedule",
    "parameter_groups",
    "warmup_cosine",
    "weight_decayed",
]

GROUPS = ("trunk_decay", "trunk_no_decay", "heads_decay", "heads_no_decay")


def weight_decayed(name: str, param: Tensor) -> bool:
    """Whether the optimizer decays parameter ``name``: matrices do; biases, norms, position
    embeddings and tokens (CLS, registers, E-RADIO's summary queries ``latent``) do not;
    σReparam scales always do, whatever their shape, so that spectral norms stay small (PHI-S
    A.7)."""
    if name.endswith(SPECTRAL_SCALE):
        return True
    tokens = ("pos_embed", "cls_token", "registers", "latent")
    return param.ndim >= 2 and not name.endswith(tokens)


def adamw(params: Any) -> torch.optim.Optimizer:
    """The papers' default optimizer settings (AM-RADIO 4: AdamW, LR 1e-3; weight decay 0.02)."""
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.02)


def parameter_groups(named: Iterable[tuple[str, nn.Parameter]]) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: trunk and heads apart, each with and without decay.

    Named ``trunk_decay``, ``trunk_no_decay`` (``student.*``) and ``heads_decay``,
    ``heads_no_decay`` (everything else); biases, norms, position embeddings and tokens get no
    weight decay (:func:`weight_decayed`). The trunk has groups of its own so that its
    optimizer state (e.g. timm ``Lamb``'s per-group step counter) can start afresh when
    ``FreezeBody`` releases it (PHI-S A.7) while the heads' state carries on.
    """
    groups: dict[str, list[nn.Parameter]] = {name: [] for name in GROUPS}
    for name, param in named:
        part = "trunk" if name.startswith("student.") else "heads"
        groups[f"{part}_{'decay' if weight_decayed(name, param) else 'no_decay'}"].append(param)
    return [
        {"params": params, "name": name, **({"weight_decay": 0.0} if "no_decay" in name else {})}
        for name, params in groups.items()
        if params
    ]


#: The per-group keys that choose a torch optimizer's implementation.
_IMPLEMENTATION = ("fused", "foreach")


def fastest_implementation(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt with its fused implementation, else its ``foreach`` one, when it
    has them and the config chose neither (both ``None``: torch then picks ``foreach`` for CUDA
    tensors only, and a per-parameter Python loop on CPUs, ~100x the operations of the fused
    step for the quickstart's AdamW).

    Fused where torch has the kernel for the parameters' device (AdamW, Adam, SGD, Adagrad:
    CPU and CUDA among others), on plain tensors; ``foreach`` for FSDP2's sharded ``DTensor``
    parameters [choice: the implementation FSDP2's own examples use] and for optimizers without
    a fused one (NAdam, RAdam, RMSprop). timm's ``Lamb`` becomes radio-lit's
    :class:`~radio_lit.training.lamb.Lamb`, the same optimizer whose update is compiled where
    that is faster (CUDA) and whose step is multi-tensor on every device. A config that sets
    ``fused`` or ``foreach`` (even to ``false``) keeps its choice; an optimizer without these
    options is returned as it is (radio-lit's ``Lamb`` among them: it chooses for itself).
    """
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = optimizer.defaults
    chosen = {k: defaults[k] for k in _IMPLEMENTATION if defaults.get(k) is not None}
    if type(optimizer) is not timm.optim.Lamb and (
        not any(k in accepted for k in _IMPLEMENTATION) or chosen
    ):
        return optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]
    settings = {k: v for k, v in defaults.items() if k in accepted and k not in _IMPLEMENTATION}
    groups = [
        {k: v for k, v in group.items() if k not in _IMPLEMENTATION}
        for group in optimizer.param_groups
    ]
    if type(optimizer) is timm.optim.Lamb:
        return Lamb(groups, **settings, **chosen)
    if "fused" in accepted and not any(isinstance(p, DTensor) for p in params):
        try:
            return type(optimizer)(groups, **settings, fused=True)
        except RuntimeError:  # no fused kernel for this device or dtype
            pass
    if "foreach" in accepted:
        return type(optimizer)(groups, **settings, foreach=True)
    return optimizer


def optimizer_of(module: Any) -> torch.optim.Optimizer | None:
    """The optimizer a LightningModule trains with, or ``None`` outside a fit."""
    trainer = getattr(module, "_trainer", None)
    optimizers = trainer.optimizers if trainer is not None else []
    return optimizers[0] if optimizers else None


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, then cosine annealing to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_and_schedule(
    factory: Callable[[Any], torch.optim.Optimizer],
    named: Iterable[tuple[str, nn.Parameter]],
    total_steps: int,
    warmup_steps: int,
    min_ratio: float,
) -> dict[str, Any]:
    """Lightning's ``configure_optimizers`` answer: the optimizer over :func:`parameter_groups`
    in its fastest implementation (:func:`fastest_implementation`) and a per-step
    :func:`warmup_cosine` schedule over ``total_steps``."""
    optimizer = fastest_implementation(factory(parameter_groups(named)))
    total = max(1, int(total_steps))
    schedule = LambdaLR(optimizer, lambda step: warmup_cosine(step, warmup_steps, total, min_ratio))
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": schedule, "interval": "step", "name": "lr"},
    }
