"""EMA student and shift-equivariant MESA (C-RADIOv4 report 2.3.2; notes 2.4).

MESA (Du et al., NeurIPS 2022) matches the student to its own exponential moving average;
C-RADIOv4 gives the EMA student its own shifted view of the crop and compares both on the
overlap, after a LayerNorm without affine parameters on both sides::

    L_mesa = (1/|Ω|) Σ_{u ∈ Ω} ‖ F_{S→S̃}[LN(x)](u) − LN(x̃)(u) ‖²

``x̃`` receives no gradient. The EMA copy (of the student *and* its adaptor heads, so that an
exported EMA model is coherent) is updated after every optimizer step with the decay 0.9996
for the whole run (RADIO #181), lives in the module's state (``ema.student.*``,
``ema.heads.*``: checkpointed, resumed exactly), and can be exported instead of the raw weights
(NVlabs' loaders prefer ``state_dict_ema``).

``[choice]`` (the report does not say):

- what ``x`` is: ``"backbone"`` (default: the student's patch tokens), ``"heads"`` (each
  adaptor's dense output, averaged over teachers) or ``"both"`` (their sum);
- the EMA view: the student's resolution, its own shift drawn like the student's
  (:class:`~radio_lit.geometry.shifts.PatchShifts`; unshifted when the run has no ``model.shifts``);
- the EMA runs in eval mode (no CPE jitter, no dropout, no DAMP noise);
- the weight of the term (``weight``, default 1.0, added to the balanced total).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.geometry.shifts import combined_mask, masked_loss, to_crop_frame
from radio_lit.losses import MSE

__all__ = ["MESA", "EMAStudent", "check_pairs", "fill_missing_ema", "mesa_loss"]

MesaTarget = Literal["backbone", "heads", "both"]


class MESA:
    """The EMA student and its MESA term (``model.mesa``).

    Args:
        decay: EMA decay per optimizer step (RADIO #181: 0.9996 for the whole run).
        weight: the MESA term's weight in the loss ``[choice]``; 0 keeps the EMA only.
        applies_to: ``"backbone"``, ``"heads"`` or ``"both"`` ``[choice]`` (module docstring).
    """

    def __init__(
        self, decay: float = 0.9996, weight: float = 1.0, applies_to: MesaTarget = "backbone"
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"model.mesa.init_args.decay must lie in [0, 1), got {decay}")
        if not weight >= 0.0:
            raise ValueError(f"model.mesa.init_args.weight must be >= 0, got {weight}")
        if applies_to not in ("backbone", "heads", "both"):
            raise ValueError(
                f"model.mesa.init_args.applies_to={applies_to!r} is not 'backbone', 'heads' "
                "or 'both'"
            )
        self.decay = decay
        self.weight = weight
        self.applies_to = applies_to

    def __repr__(self) -> str:
        return f"MESA(decay={self.decay}, weight={self.weight}, applies_to={self.applies_to!r})"


class EMAStudent(nn.Module):
    """A frozen moving-average copy of the student and its heads (``ema.student``,
    ``ema.heads``); always in eval mode, never optimized."""

    def __init__(self, student: nn.Module, heads: nn.Module, decay: float) -> None:
        super().__init__()
        self.student = copy.deepcopy(student).requires_grad_(False)
        self.heads = copy.deepcopy(heads).requires_grad_(False)
        self.decay = decay
        super().train(False)

    def train(self, mode: bool = True) -> EMAStudent:
        return super().train(False)

    @torch.no_grad()
    def update(self, student: nn.Module, heads: nn.Module, trunk: bool = True) -> None:
        """``ema ← decay · ema + (1 − decay) · live`` for every parameter, as one multi-tensor
        lerp; buffers (σReparam's power-iteration vectors) copied, as one multi-tensor copy.

        ``trunk=False`` (a step whose student trunk does not train, ``FreezeBody``): only the
        heads' EMA follows; the EMA of the trunk, parameters and buffers, is held as it is,
        so no step is taken toward weights that do not train and the average carried from
        the earlier stage survives the frozen steps whole ``[choice]`` (the rule: the EMA
        averages what trains; with the trunk held for 5,000 steps at decay 0.9996, following
        it would keep only 0.9996^5000 ≈ 13.5 % of the carried average).

        Under FSDP2 the EMA is sharded like the live student and heads and paired shard with
        shard. An FSDP2 root keeps its gathered parameters (plain tensors) after a forward
        that no backward followed (the EMA's MESA forward, under ``no_grad``): every FSDP2
        unit of both sides is resharded first, so that each side's parameters are the sharded
        ``DTensor`` s the optimizer updates; :func:`check_pairs` then refuses, in one line, a
        pair of another kind, placement, shape or dtype."""
        for module in (self, student, heads):
            _reshard(module)
        pairs = [(self.student, student), (self.heads, heads)] if trunk else [(self.heads, heads)]
        ema = [named for mine, _ in pairs for named in mine.named_parameters()]
        live = [p for _, theirs in pairs for p in theirs.parameters()]
        check_pairs(ema, live)
        torch._foreach_lerp_([p for _, p in ema], live, 1.0 - self.decay)
        mine = [b for own, _ in pairs for b in own.buffers()]
        if mine:
            torch._foreach_copy_(mine, [b for _, theirs in pairs for b in theirs.buffers()])

    @torch.no_grad()
    def reset(self, student: nn.Module, heads: nn.Module) -> None:
        """Start over from the live weights (e.g. after ``model.init_from``)."""
        self.student.load_state_dict(student.state_dict())
        self.heads.load_state_dict(heads.state_dict())


def _reshard(module: nn.Module) -> None:
    """Every FSDP2 unit in ``module`` back to its shards (nothing without FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def _kind(tensor: Tensor) -> str:
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return f"plain {tuple(tensor.shape)} {tensor.dtype} tensor"
    return f"DTensor {tuple(tensor.shape)} {tensor.dtype} placed {tuple(placements)}"


def check_pairs(ema: Sequence[tuple[str, Tensor]], live: Sequence[Tensor]) -> None:
    """Raise ``RuntimeError`` (one line, the first pair at fault) unless every EMA parameter
    ``(name, tensor)`` and its live counterpart have the same kind (plain tensor or FSDP2
    ``DTensor``), placements and device mesh, shape and dtype."""
    if len(ema) != len(live):
        raise RuntimeError(
            f"EMA update: the EMA student and heads have {len(ema)} parameters, the live ones "
            f"{len(live)}; build the EMA from this student (model.mesa)"
        )
    for (name, mine), theirs in zip(ema, live, strict=True):
        placed = getattr(mine, "placements", None), getattr(theirs, "placements", None)
        meshes = getattr(mine, "device_mesh", None), getattr(theirs, "device_mesh", None)
        same = placed[0] == placed[1] and meshes[0] == meshes[1]
        if not (same and mine.shape == theirs.shape and mine.dtype == theirs.dtype):
            raise RuntimeError(
                f"EMA update: ema.{name} is a {_kind(mine)} but the live parameter a "
                f"{_kind(theirs)}; both must be sharded alike (configure_model shards the EMA "
                "as the student) and resharded before the update"
            )


def fill_missing_ema(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
) -> None:
    """A load-state-dict pre-hook: a checkpoint without ``ema.*`` (written before the EMA,
    or by a run without it) gets the EMA's keys from its own ``student.*`` and ``heads.*``
    weights, so the EMA starts at the loaded weights."""
    if any(key.startswith(prefix + "ema.") for key in state_dict):
        return
    for key in [k for k in state_dict if k.startswith((prefix + "student.", prefix + "heads."))]:
        state_dict[prefix + "ema." + key[len(prefix) :]] = state_dict[key]


def _layer_norm(x: Tensor) -> Tensor:
    """LayerNorm over channels without affine parameters, in float32."""
    return F.layer_norm(x.float(), (x.shape[-1],))


def mesa_loss(
    online: Mapping[str, Tensor],
    ema: Mapping[str, Tensor],
    online_shift: Tensor | None,
    ema_shift: Tensor | None,
) -> Tensor:
    """The MESA term between matching maps ``{key: [B, h, w, C]}`` of the online student
    (with gradient) and of the EMA (no gradient), each from its own view (shifted by
    ``[B, 2]`` tokens, or ``None``): LN both, move both to the crop frame, MSE on the
    overlap, averaged over the keys."""
    terms = []
    for key, x in online.items():
        x, seen = _layer_norm(x), None
        target, seen_ema = _layer_norm(ema[key]).detach(), None
        if online_shift is not None:
            x, seen = to_crop_frame(x, online_shift)
        if ema_shift is not None:
            target, seen_ema = to_crop_frame(target, ema_shift)
        terms.append(masked_loss(MSE(), x, target, combined_mask(seen, seen_ema), False))
    return torch.stack(terms).mean()
