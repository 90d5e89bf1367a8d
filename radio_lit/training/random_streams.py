"""Random streams of one rank: seeded from the run's seed and the global rank, saved in every
checkpoint for every rank, resumed exactly (DESIGN.md "Distributed rules").

``seed_everything`` gives every rank the same global generators, so any draw made from them is
the same on every rank. Draws that must differ per rank come from a :class:`RankStream`
instead: DAMP's weight noise is a fresh draw per sub-batch *per device* (Trinh et al. 2024;
C-RADIOv4 notes 2.5), and each image's view shifts and CPE window are its own draw whichever
rank holds it (notes 2.3, AM-RADIO 3.3).

A stream is a set of generator states (torch's CPU generator, and a CUDA device's when a
block runs there) that :meth:`RankStream.active` swaps in for torch's default generators for
the duration of a block, and out again afterwards: code inside draws as it always does
(``torch.randn``, dropout, a compiled student's random operations, which a ``generator=``
argument would split into several graphs), from this rank's stream, while the global
generators, which the other per-step draws shared by all ranks use, are left as they were.

Every rank's states reach a checkpoint through :func:`gather_ranks` (an all-gather, the
mechanism :class:`~radio_lit.callbacks.RandomStates` uses for the global generators) and come
back through :func:`own_rank`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from radio_lit.data.resumable import sample_seed

__all__ = ["STREAM_SEEDS", "RankStream", "gather_ranks", "own_rank"]

#: The first of the four keys of every rank stream's seed, ``sample_seed(STREAM_SEEDS, run
#: seed, rank, purpose)``: a space of its own [choice]. A crop's seed has three keys,
#: ``sample_seed(data seed, epoch, index)`` (:mod:`radio_lit.data.resumable`), a shard
#: reader's five: with ``(run seed, rank, purpose)`` alone, rank ``r``'s forward stream
#: (purpose 1) would draw what the crop of image 1 in epoch ``r`` draws whenever
#: ``seed_everything`` and ``data.seed`` are one number (the recipes give both the stage
#: number). A stream's seed is saved in every checkpoint, so a run started before this space
#: resumes with the seeds it started with.
STREAM_SEEDS = 0x5EED_5742


def gather_ranks(state: Any) -> list[Any]:
    """Every rank's ``state`` (picklable), in rank order: an all-gather when
    ``torch.distributed`` runs (every rank calls it together), else ``[state]``."""
    if dist.is_available() and dist.is_initialized():
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, state)
        return ranks
    return [state]


def own_rank(ranks: Sequence[Any] | None, world_size: int, rank: int, what: str) -> Any:
    """Rank ``rank``'s entry of :func:`gather_ranks`'s ``ranks``; ``None`` (and a warning on
    rank 0 naming ``what``) when they were saved by another number of ranks: resuming then
    cannot draw exactly what the interrupted run would have drawn."""
    if ranks is None:
        return None
    if len(ranks) != world_size:
        rank_zero_warn(
            f"the checkpoint holds the {what} of {len(ranks)} rank(s) but this run has "
            f"{world_size}: the resumed run keeps fresh {what} and does not draw exactly what "
            "the interrupted run would have drawn"
        )
        return None
    return ranks[rank]


class RankStream:
    """This rank's own random stream for one purpose (module docstring).

    Args:
        purpose: a number that tells streams of one rank apart (each stream's seed is
            ``sample_seed(STREAM_SEEDS, run seed, global rank, purpose)``).

    Before :meth:`start` (a module used outside a ``Trainer``), :meth:`active` changes
    nothing: draws come from torch's global generators.
    """

    def __init__(self, purpose: int) -> None:
        self.purpose = purpose
        self.seed: int | None = None
        self.states: dict[str, Tensor] = {}  # generator state by device ("cpu", "cuda:0")

    def start(self, seed: int, rank: int) -> None:
        """Seed the stream from the run's ``seed`` and the global ``rank``, unless it has
        started (or been restored from a checkpoint) already."""
        if self.seed is None:
            self.seed = sample_seed(STREAM_SEEDS, seed, rank, self.purpose)

    @contextmanager
    def active(self, device: torch.device) -> Iterator[None]:
        """Within the block, torch's default generators of the CPU and of ``device`` (a CUDA
        device) draw from this stream; their own states are restored afterwards."""
        if self.seed is None:
            yield
            return
        keys = ["cpu"] + ([_cuda_key(device)] if device.type == "cuda" else [])
        outside = {key: _get_state(key) for key in keys}
        for key in keys:
            _set_state(key, self.states[key] if key in self.states else _seeded(key, self.seed))
        try:
            yield
        finally:
            for key in keys:
                self.states[key] = _get_state(key)
                _set_state(key, outside[key])

    def state_dict(self) -> dict[str, Any]:
        """The seed and every device's generator state (CPU tensors)."""
        return {"seed": self.seed, "states": dict(self.states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        self.states = dict(state["states"])


def _cuda_key(device: torch.device) -> str:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index}"


def _get_state(key: str) -> Tensor:
    if key == "cpu":
        return torch.get_rng_state()
    return torch.cuda.get_rng_state(key)


def _set_state(key: str, state: Tensor) -> None:
    if key == "cpu":
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, key)


def _seeded(key: str, seed: int) -> Tensor:
    """A fresh generator state of device ``key`` seeded with ``seed``."""
    return torch.Generator(device=key).manual_seed(seed).get_state()
