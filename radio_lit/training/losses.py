"""The step's losses and balancer (DESIGN.md, "One training step" 6): per-teacher feature and
summary terms (AM-RADIO eq. 2-3; PHI-S eqs. 1-4), the EMA student's MESA term (C-RADIOv4 report
2.3.2), the idle heads' zero term (AM-RADIO 4, partitions), and the balancer's total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from radio_lit.geometry.shifts import masked_loss
from radio_lit.losses import Balancer
from radio_lit.students import StudentOutput, TeacherHeads
from radio_lit.students.ema import MESA, EMAStudent, mesa_loss
from radio_lit.training.matching import TeacherMatch
from radio_lit.training.partitions import Chunk, PartitionPlan
from radio_lit.training.student_step import EMAView, student_shift

__all__ = ["balanced_loss", "distillation_losses", "idle_heads_term", "mesa_term", "with_mesa"]


def distillation_losses(
    matches: Mapping[str, TeacherMatch],
    feature_loss: nn.Module,
    summary_loss: nn.Module,
    per_sample: bool = False,
    dispersions: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Per-teacher feature and summary losses, keyed ``"<teacher>/feature_loss"`` etc.

    Scalars, or ``[B]`` per image with ``per_sample`` (for the balancer). ``dispersions``:
    each teacher's summary dispersion ``Disp_y`` for an angle-balanced summary loss
    (:class:`~radio_lit.losses.AngleBalanced`, C-RADIOv4 report eq. 7).
    """
    kwargs = {"per_sample": True} if per_sample else {}
    dispersions = dispersions or {}
    losses: dict[str, Tensor] = {}
    for name, m in matches.items():
        losses[f"{name}/feature_loss"] = masked_loss(
            feature_loss, m.features, m.target, m.valid, per_sample
        )
        if m.summary is not None and m.summary_target is not None:
            scale = {"dispersion": dispersions[name]} if name in dispersions else {}
            losses[f"{name}/summary_loss"] = summary_loss(
                m.summary, m.summary_target, **kwargs, **scale
            )
    return losses


def balanced_loss(
    balancer: Balancer,
    chunks: Sequence[Chunk],
    terms: Sequence[Mapping[str, Tensor]],
    observe: bool,
) -> Tensor:
    """The step's loss: each chunk's loss terms combined by the balancer, weighted by the
    chunk's share of the update (``Chunk.weight``, :mod:`radio_lit.training.partitions`).

    With ``observe`` (training), the balancer first sees every chunk's terms once for the
    whole step (:meth:`radio_lit.losses.Balancer.observe`): one reduction per step on every
    rank, whatever its number of chunks (DESIGN.md, "Distributed rules").
    """
    if observe:
        balancer.observe(terms, [chunk.fraction for chunk in chunks])
    losses = [
        balancer(t) if chunk.weight == 1 else chunk.weight * balancer(t)
        for chunk, t in zip(chunks, terms, strict=True)
    ]
    return losses[0] if len(losses) == 1 else torch.stack(losses).sum()


def mesa_term(
    mesa: MESA,
    chunks: Sequence[Chunk],
    online: Sequence[StudentOutput],
    averages: Sequence[EMAView],
    heads: Mapping[str, TeacherHeads],
    ema: EMAStudent,
) -> Tensor:
    """``sum_c w_c L_mesa(c)`` over the step's chunks (chunk weights ``w_c`` as
    :func:`balanced_loss`'s), unweighted by MESA's own weight: each chunk's
    :func:`~radio_lit.students.ema.mesa_loss` between the student's and the EMA student's maps
    that ``mesa.applies_to`` names (the backbone's, the heads', or both), each on its own view."""
    total = []
    for chunk, out, average in zip(chunks, online, averages, strict=True):
        maps, ema_maps = {}, {}
        if mesa.applies_to in ("backbone", "both"):
            maps["backbone"], ema_maps["backbone"] = out.features, average.output.features
        if mesa.applies_to in ("heads", "both"):
            for name in chunk.teachers:
                maps[name] = heads[name].features(out.features)
                with torch.no_grad():
                    ema_maps[name] = ema.heads[name].features(average.output.features)
        term = mesa_loss(maps, ema_maps, student_shift(chunk), average.shift)
        total.append(term if chunk.weight == 1 else chunk.weight * term)
    return total[0] if len(total) == 1 else torch.stack(total).sum()


def with_mesa(
    loss: Tensor,
    chunks: Sequence[Chunk],
    online: Sequence[StudentOutput],
    heads: Mapping[str, TeacherHeads],
    mesa: MESA | None,
    averages: Sequence[EMAView] | None,
    ema: EMAStudent | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``loss`` plus MESA's weight times :func:`mesa_term`, and the term's log
    ``{"train/mesa_loss": term}``; ``(loss, {})`` without the EMA student's views
    (``averages``: :meth:`~radio_lit.training.student_step.StudentStep.average`)."""
    if mesa is None or averages is None or ema is None:
        return loss, {}
    term = mesa_term(mesa, chunks, online, averages, heads, ema)
    return loss + mesa.weight * term, {"train/mesa_loss": term}


def idle_heads_term(heads: Mapping[str, TeacherHeads], plan: PartitionPlan, width: int) -> Tensor:
    """``0 x`` the heads of the teachers this rank does not run in training (``plan``'s
    :meth:`~radio_lit.training.partitions.PartitionPlan.idle_teachers`) on a zero probe
    ``[1, width]``, so every rank's backward reaches every head and DDP finds no unused
    parameter (their gradient here is zero; DDP's average then gives the update of
    :mod:`radio_lit.training.partitions`)."""
    zero = torch.zeros(())
    for name in plan.idle_teachers():
        for head in (heads[name].features, heads[name].summary):
            if head is not None:
                probe = torch.zeros(1, width, device=head.out.weight.device)
                zero = zero.to(probe.device) + 0.0 * head(probe).sum()
    return zero
