"""Teacher statistics over the ranks of a run: accumulate, refit, share (PHI-S A.7; AM-RADIO 4).

While a stage estimates its teacher distributions, each step adds every feature a teacher
produced on this rank (all of its chunks together) to that teacher's normalizer in one
:meth:`~radio_lit.normalizers.Normalizer.update`, a collective over the ranks that run the
teacher (its process group); refit steps recompute the transforms. With partitions, a rank
outside a teacher's group never sees its features: :func:`share_statistics` hands it the
group's state (count, mean, scatter and fit) from the group's first rank. Every rank calls it
at each refit and before every checkpoint (which rank 0 writes), in teacher order, so every
rank issues the same collectives and a checkpoint holds each teacher's complete accumulators
at the step it is taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from radio_lit.normalizers.base import Normalizer

__all__ = [
    "accumulate_outputs",
    "accumulate_statistics",
    "complete_checkpoint",
    "share_statistics",
    "statistics_ready",
]


def statistics_ready(normalizers: Mapping[str, Normalizer]) -> bool:
    """Whether every normalizer can map targets (fitted, or needs no statistics)."""
    return all(n.is_fitted or not n.requires_statistics for n in normalizers.values())


def accumulate_statistics(
    normalizers: Mapping[str, Normalizer],
    features: Sequence[Mapping[str, Tensor]],
    refit: bool,
    sources: Mapping[str, int],
    masks: Sequence[Mapping[str, Tensor]] | None = None,
) -> None:
    """Add one step's teacher features to the statistics; on ``refit`` steps, refit and share.

    Args:
        normalizers: each teacher's normalizer.
        features: one ``{name: [B, H, W, C]}`` per chunk of this rank's step, on the loss grid;
            a teacher absent from every chunk is not run by this rank (nor in its group).
        refit: recompute every transform from everything accumulated, then share it.
        sources: teacher name -> first global rank of its process group, for teachers that
            run on only some ranks (:attr:`radio_lit.training.partitions.PartitionPlan.sources`).
        masks: one ``{name: [B, H, W]}`` bool per chunk, the tokens to count (a teacher
            without an entry counts all of its chunk's); ``None``: every token. Counted as
            masked sums (:meth:`~radio_lit.normalizers.Normalizer.update`): no host read.
    """
    for name, normalizer in normalizers.items():
        chunks = [i for i, chunk in enumerate(features) if name in chunk]
        if not chunks:
            continue  # not in this teacher's group: it issues none of the group's collectives
        rows = torch.cat([features[i][name].float().reshape(-1, normalizer.dim) for i in chunks])
        given = [masks[i].get(name) if masks is not None else None for i in chunks]
        if all(mask is None for mask in given):
            normalizer.update(rows)
        else:
            flags = [
                mask.reshape(-1)
                if mask is not None
                else torch.ones(
                    features[i][name].shape[:-1].numel(), dtype=torch.bool, device=rows.device
                )
                for i, mask in zip(chunks, given, strict=True)
            ]
            normalizer.update(rows, torch.cat(flags))
        if refit:
            normalizer.fit()
    if refit:
        share_statistics(normalizers, sources)


def accumulate_outputs(
    normalizers: Mapping[str, Normalizer],
    dispersions: Mapping[str, Normalizer],
    outputs: Sequence[Mapping[str, Any]],
    refit: bool,
    sources: Mapping[str, int],
) -> None:
    """One estimation step of teacher outputs (``radio_lit.teachers.TeacherOutput``, one
    ``{name: output}`` per chunk, on the loss grid): the features each view saw (a shifted
    view's valid tokens only, ``output.valid``, as a mask: no host read) into the normalizers,
    the summaries into the summary dispersions (:func:`accumulate_statistics`, in that
    order)."""
    features = [{n: o.features for n, o in chunk.items()} for chunk in outputs]
    masks = [{n: o.valid for n, o in chunk.items() if o.valid is not None} for chunk in outputs]
    accumulate_statistics(normalizers, features, refit, sources, masks)
    summaries = [{n: o.summary for n, o in c.items() if o.summary is not None} for c in outputs]
    accumulate_statistics(dispersions, summaries, refit, sources)


def share_statistics(normalizers: Mapping[str, Normalizer], sources: Mapping[str, int]) -> None:
    """Copy each partially-run teacher's state from its group's first rank to every rank.

    A collective over the world, issued by every rank together (in ``sources``' order).
    Without torch.distributed, or with every teacher on every rank, it does nothing.
    """
    for name, source in sources.items():
        if name in normalizers:  # e.g. no summary dispersion for a teacher without a summary
            normalizers[name].broadcast_state(source)


def complete_checkpoint(
    normalizers: Mapping[str, Normalizer],
    sources: Mapping[str, int],
    state: dict[str, Tensor],
    prefix: str = "normalizers",
) -> None:
    """Before a checkpoint is written (every rank, together): :func:`share_statistics`, then
    put the shared buffers into the checkpoint's ``state`` (keys ``<prefix>.<name>.*``).

    Any teacher statistic with the normalizers' protocol (``update``, ``fit``,
    ``broadcast_state``, e.g. :class:`~radio_lit.losses.AngularDispersion`) goes through
    these functions too."""
    share_statistics(normalizers, sources)
    for name in sources.keys() & normalizers.keys():
        prefix_of = f"{prefix}.{name}."
        for key, buffer in normalizers[name].state_dict(prefix=prefix_of).items():
            if key in state:
                state[key] = buffer.clone()
