"""Rank/teacher partitions (AM-RADIO 4 "Rank/Teacher Partitioning"; PHI-S 3; RADIOv2.5 4.6).

A partition is a group of teachers with its own batch size and student resolution(s). AM-RADIO
gives half of its 64 GPUs to CLIP+DINOv2 (432 px, batch 1024) and half to SAM (1024 px, batch
128); PHI-S gives every teacher its own partition of 256 images (batch 1024); RADIOv2.5 keeps
one partition with every teacher (the default here).

**Ranks.** With at least as many ranks as partitions, partition ``p`` gets a contiguous block
of ranks ``R_p`` whose size is proportional to its ``rank_share`` (largest remainder, at least
one each). With fewer ranks than partitions (e.g. one CPU), partition ``i`` runs on rank
``i mod world_size``, and a rank runs its partitions one after the other within the step.

**The balanced layout** (``every_rank: true``): a partition runs on every rank, each taking
``batch_size / W`` of its images every step (C-RADIOv4 at 64 GPUs: 16 low-res and 2 high-res
images a rank, instead of 32 low-res ranks of 32 and 32 high-res ranks of 4). Ranks then do the
same work at every draw, and no rank waits for another at the gradients' collective
(``radio-lit plan`` prices the wait of the other layout). The other partitions share the ranks
as above. [choice] The update is unchanged (``|R_p| = W`` below), every teacher of such a
partition runs on every rank (its statistics reduce over the world), and the resolution draws
are not coupled across partitions: each partition draws its own, in partition order, from the
global RNG seeded alike on every rank, so all ranks run the same resolutions and each
partition keeps its marginal distribution (``probabilities``).

**Batches.** ``batch_size`` is the partition's batch per optimizer step over all its ranks, so
each of its ranks takes ``batch_size / |R_p|`` images. The datamodule yields the same per-rank
batch on every rank; a rank's partitions take consecutive, disjoint slices of it in partition
order (so two partitions on one rank never see the same image, as on separate GPUs), and the
rest of the batch is unused: at setup each rank tells the datamodule how many rows it uses
(``use_rows``, radio_lit.data.datamodule), which then loads and decodes only those (the same
images, as many batches). Set ``data.init_args.batch_size`` to the largest per-rank need
(e.g. AM-RADIO on 64 GPUs: 32; on one GPU: 1024 + 128 = 1152).

**The update.** On the papers' clusters each GPU averages the loss over its own images and DDP
averages gradients over all ranks, so the update is ``sum_p s_p grad L_p``, ``L_p`` the
partition's loss averaged over its whole batch and ``s_p = |R_p| / W`` its share of the ranks.
Here ``s_p`` is the configured share (normalized), and a rank scales its partition's loss by
``s_p W / |R_p|``: whatever the world size ``W``, after DDP's (or FSDP's) gradient average the
update is ``sum_p s_p grad L_p`` (one rank running everything: ``W = |R_p| = 1``).

**Statistics.** Teacher ``k``'s normalizer accumulates over exactly the ranks that run ``k``
(a ``torch.distributed`` group); after each refit every rank receives the group's result, so
every rank (and the checkpoint rank 0 writes) holds every teacher's statistics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from radio_lit.core.errors import ConfigError
from radio_lit.geometry.shifts import ChunkShifts


@dataclass
class Partition:
    """One partition of teachers (values of ``model.partitions``, keyed by a name).

    Attributes:
        teachers: teacher names this partition runs; ``None``: every teacher.
        batch_size: images per optimizer step over all of this partition's ranks;
            ``None``: the whole per-rank batch (only allowed with a single partition).
        resolutions: student resolutions (square sides) of this partition; one is drawn per
            step from torch's global RNG (RADIOv2.5 4.2 multi-resolution training);
            ``None``: ``model.student_resolution``.
        rank_share: relative share of the ranks (and of the update, see the module docstring).
        probabilities: the chance of each of ``resolutions`` in a step's draw (C-RADIOv4
            report 2.2: per-step draws within each partition; the report gives none);
            ``None``: uniform.
        eval_resolution: the side the partition is validated at; ``None``: the first of
            ``resolutions``.
        every_rank: run on every rank, ``batch_size / W`` images each (the balanced layout,
            module docstring; its ``rank_share`` then weighs only its update); ``False``: on
            its block of ranks by ``rank_share``.
    """

    teachers: list[str] | None = None
    batch_size: int | None = None
    resolutions: list[int] | None = None
    rank_share: float = 1.0
    probabilities: list[float] | None = None
    eval_resolution: int | None = None
    every_rank: bool = False


@dataclass
class Chunk:
    """One partition's work on this rank for one step.

    Attributes:
        partition: the partition's name.
        crop: ``[n, 3, S, S]`` the partition's slice of the rank's crops.
        teachers: the teachers to run, in ``model.teachers`` order.
        resolution: ``(H, W)`` of the student's view this step.
        weight: the factor on this chunk's loss (``s_p W / |R_p|`` in training).
        fraction: this rank's share of the partition's batch, ``1 / |R_p|`` in training (1 in
            evaluation), so that per-step averages over chunks (AdaLoss) count each partition
            once whatever the number of ranks it is split over.
        rows: the rows of the rank's batch that ``crop`` holds (what else the batch carries
            for these images, e.g. cached teacher outputs, is sliced alike).
        shifts: the views' shifts this step (shift-equivariant training, radio_lit.geometry.shifts);
            ``None``: unshifted views.
    """

    partition: str
    crop: Tensor
    teachers: tuple[str, ...]
    resolution: tuple[int, int]
    weight: float
    fraction: float = 1.0
    rows: slice = field(default_factory=lambda: slice(None))
    shifts: ChunkShifts | None = None


def assign_ranks(shares: Sequence[float], world_size: int) -> list[list[int]]:
    """The ranks of each partition (see the module docstring).

    Args:
        shares: each partition's positive ``rank_share``.
        world_size: number of ranks ``W``.

    Returns:
        ``ranks[p]``: sorted global ranks running partition ``p``. With ``W >= P`` the blocks
        are contiguous, disjoint, cover every rank, and their sizes follow the shares (largest
        remainder, each at least one); otherwise ``ranks[p] == [p % W]``.
    """
    count = len(shares)
    if world_size < count:
        return [[p % world_size] for p in range(count)]
    total = float(sum(shares))
    spare = world_size - count  # every partition gets one rank, the rest by share
    exact = [spare * s / total for s in shares]
    sizes = [1 + math.floor(e) for e in exact]
    by_remainder = sorted(range(count), key=lambda p: (math.floor(exact[p]) - exact[p], p))
    for p in by_remainder[: world_size - sum(sizes)]:
        sizes[p] += 1
    ranks, start = [], 0
    for size in sizes:
        ranks.append(list(range(start, start + size)))
        start += size
    return ranks


@dataclass
class _Placement:
    """Where the partitions run for one world size (computed by :meth:`PartitionPlan.place`)."""

    world_size: int = 1
    rank: int = 0
    ranks: dict[str, list[int]] = field(default_factory=dict)
    #: teacher name -> global ranks running it (sorted)
    teacher_ranks: dict[str, list[int]] = field(default_factory=dict)


class PartitionPlan:
    """The partitions of one module, placed on the ranks of a run.

    Args:
        partitions: ``model.partitions`` (``None``: one partition with every teacher).
        teachers: every teacher name, in ``model.teachers`` order.
        default_resolution: ``model.student_resolution`` as ``(H, W)``.
        patch_size: the student's patch size (resolutions must be multiples of it).
    """

    def __init__(
        self,
        partitions: Mapping[str, Partition] | None,
        teachers: Sequence[str],
        default_resolution: tuple[int, int],
        patch_size: int,
    ) -> None:
        self.teachers = tuple(teachers)
        self.default_resolution, self.patch_size = default_resolution, patch_size
        given = dict(partitions or {"all": Partition()})
        if not given:
            raise ValueError("model.partitions is empty; omit it for one partition of all teachers")
        self.partitions: dict[str, Partition] = {}
        self.resolutions: dict[str, list[tuple[int, int]]] = {}
        self.members: dict[str, tuple[str, ...]] = {}
        covered: set[str] = set()
        for name, part in given.items():
            key = f"model.partitions.{name}"
            members = part.teachers if part.teachers is not None else list(self.teachers)
            unknown = sorted(set(members) - set(self.teachers))
            if unknown or not members:
                raise ValueError(
                    f"{key}.teachers={members} must name some of the teachers "
                    f"{list(self.teachers)} (unknown: {unknown})"
                )
            if part.batch_size is None and len(given) > 1:
                raise ValueError(
                    f"{key}.batch_size is required with several partitions (images per step "
                    "over the partition's ranks, e.g. 256 per teacher in PHI-S)"
                )
            if part.batch_size is not None and part.batch_size < 1:
                raise ValueError(f"{key}.batch_size must be positive, got {part.batch_size}")
            if not part.rank_share > 0:
                raise ValueError(f"{key}.rank_share must be positive, got {part.rank_share}")
            sides = part.resolutions
            sizes = [default_resolution] if sides is None else [(s, s) for s in sides]
            bad = [s for s in sizes if s[0] % patch_size or s[1] % patch_size or s[0] < 1]
            if not sizes or bad:
                raise ValueError(
                    f"{key}.resolutions={sides} must list positive multiples of the student's "
                    f"patch size {patch_size}"
                )
            chances = part.probabilities
            if chances is not None and (
                len(chances) != len(sizes) or min(chances) < 0 or not sum(chances) > 0
            ):
                raise ValueError(
                    f"{key}.probabilities={chances} must give one chance >= 0 per resolution "
                    f"({len(sizes)}), not all 0"
                )
            evaluated = part.eval_resolution
            if evaluated is not None and (evaluated < 1 or evaluated % patch_size):
                raise ValueError(
                    f"{key}.eval_resolution={evaluated} must be a positive multiple of the "
                    f"student's patch size {patch_size}"
                )
            self.partitions[name] = part
            self.resolutions[name] = sizes
            self.members[name] = tuple(t for t in self.teachers if t in members)
            covered.update(members)
        idle = [t for t in self.teachers if t not in covered]
        if idle:
            raise ValueError(
                f"teachers {idle} are in no partition of model.partitions; add them to one "
                "(or remove them from model.teachers)"
            )
        self.placement = self.place(world_size=1, rank=0)
        #: teacher name -> the first global rank of its process group, for teachers that run
        #: on only some ranks (filled by :meth:`process_groups`)
        self.sources: dict[str, int] = {}

    # -- placement ----------------------------------------------------------------------------
    def place(self, world_size: int, rank: int) -> _Placement:
        """Assign ranks for ``world_size`` (``every_rank`` partitions: all of them; the others
        by :func:`assign_ranks`) and check each partition's batch divides evenly."""
        blocks = [n for n, p in self.partitions.items() if not p.every_rank]
        shares = [self.partitions[n].rank_share for n in blocks]
        ranks = dict(zip(blocks, assign_ranks(shares, world_size) if blocks else [], strict=True))
        ranks = {n: ranks.get(n, list(range(world_size))) for n in self.partitions}
        for name, part in self.partitions.items():
            count = len(ranks[name])
            if part.batch_size is not None and part.batch_size % count:
                nearest = max(count, round(part.batch_size / count) * count)
                fix = "" if part.every_rank else " or change rank_share"
                raise ValueError(
                    f"model.partitions.{name}.batch_size={part.batch_size} does not split over "
                    f"its {count} of {world_size} ranks; the nearest that does is {nearest} "
                    f"(a multiple of {count}){fix}"
                )
        teacher_ranks = {
            t: sorted({r for n, rs in ranks.items() if t in self.members[n] for r in rs})
            for t in self.teachers
        }
        self.placement = _Placement(world_size, rank, ranks, teacher_ranks)
        return self.placement

    @property
    def single(self) -> bool:
        """Whether every teacher runs on every rank (no process groups needed)."""
        world = list(range(self.placement.world_size))
        return all(r == world for r in self.placement.teacher_ranks.values())

    def process_groups(self) -> dict[str, tuple[dist.ProcessGroup | None, int]]:
        """Per teacher, the process group of the ranks running it and its first (global) rank.

        ``None`` stands for the whole world. Every rank must call this together (it creates
        the groups with ``torch.distributed.new_group``, in teacher order).
        """
        groups: dict[str, tuple[dist.ProcessGroup | None, int]] = {}
        world = list(range(self.placement.world_size))
        self.sources = {}
        for name in self.teachers:
            ranks = self.placement.teacher_ranks[name]
            group = None if ranks == world else dist.new_group(ranks)
            groups[name] = (group, ranks[0])
            if group is not None:
                self.sources[name] = ranks[0]
        return groups

    def rank_batch_size(self, rank: int | None = None) -> int | None:
        """Images this rank's partitions take from each batch (``None``: the whole batch)."""
        rank = self.placement.rank if rank is None else rank
        mine = [n for n, rs in self.placement.ranks.items() if rank in rs]
        sizes = [self._per_rank(n) for n in mine]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]

    def _per_rank(self, name: str) -> int | None:
        batch = self.partitions[name].batch_size
        return None if batch is None else batch // len(self.placement.ranks[name])

    # -- one step -----------------------------------------------------------------------------
    def rows(self, batch: int) -> dict[str, slice]:
        """The rows of a training batch of ``batch`` crops that each partition of this rank
        takes (in partition order, consecutive and disjoint; see the module docstring)."""
        placement = self.placement
        taken, start = {}, 0
        for name in self.partitions:
            if placement.rank not in placement.ranks[name]:
                continue
            count = self._per_rank(name)
            stop = batch if count is None else start + count
            if stop > batch:
                raise ValueError(
                    f"rank {placement.rank}'s partitions need {self.rank_batch_size()} images "
                    f"per step but the batch holds {batch}: set data.init_args."
                    f"batch_size to at least {self.rank_batch_size()}"
                )
            taken[name], start = slice(start, stop), stop
        return taken

    def chunks(self, crop: Tensor, train: bool) -> list[Chunk]:
        """This rank's chunks of the crops ``[B, 3, S, S]`` for one step.

        Training: the rank's partitions take consecutive slices of the batch (:meth:`rows`),
        each draws one of its resolutions (torch's global RNG; with its ``probabilities``) and
        is weighted ``s_p W / |R_p|``. Evaluation: every partition runs on the whole batch at
        its ``eval_resolution`` (default: its first resolution), weighted ``s_p``, so that every
        teacher is evaluated on every rank.
        """
        placement = self.placement
        total_share = sum(p.rank_share for p in self.partitions.values())
        taken = self.rows(crop.shape[0]) if train else {}
        chunks = []
        for name, part in self.partitions.items():
            share = part.rank_share / total_share
            sizes = self.resolutions[name]
            if not train:
                side = part.eval_resolution
                size = sizes[0] if side is None else (side, side)
                chunks.append(Chunk(name, crop, self.members[name], size, share))
                continue
            if name not in taken:
                continue
            ranks = placement.ranks[name]
            pick = self._draw(name) if len(sizes) > 1 else 0
            weight = share * placement.world_size / len(ranks)
            rows = taken[name]
            chunks.append(
                Chunk(
                    name, crop[rows], self.members[name], sizes[pick], weight, 1 / len(ranks), rows
                )
            )
        return chunks

    def _draw(self, name: str) -> int:
        """The index of partition ``name``'s resolution this step (torch's global RNG)."""
        chances = self.partitions[name].probabilities
        if chances is None:
            return int(torch.randint(len(self.resolutions[name]), ()))
        return int(torch.multinomial(torch.tensor(chances, dtype=torch.float), 1))

    def check_strategy(self, strategy: object) -> None:
        """Refuse strategies under which these partitions would silently go wrong.

        - ``DDPStrategy`` broadcasts rank 0's buffers at every forward unless
          ``broadcast_buffers=False``: it would overwrite the statistics a teacher's group
          accumulates on ranks where rank 0 does not run it.
        - ``ModelParallelStrategy`` (FSDP2) gathers each sharded module in call order on every
          rank; ranks running different teachers, or a different number of partitions, call
          the heads and the student in different orders and deadlock.
        """
        from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

        if self.single:
            return
        if isinstance(strategy, DDPStrategy) and strategy._ddp_kwargs.get(
            "broadcast_buffers", True
        ):
            raise ValueError(
                "model.partitions with teachers on only some ranks need trainer.strategy: "
                "{class_path: lightning.pytorch.strategies.DDPStrategy, init_args: "
                "{broadcast_buffers: false}} (DDP's buffer broadcast would overwrite the "
                "teacher statistics)"
            )
        if isinstance(strategy, ModelParallelStrategy):
            sets = {self.members[n] for n in self.partitions}
            counts = {
                sum(r in rs for rs in self.placement.ranks.values())
                for r in range(self.placement.world_size)
            }
            if len(sets) > 1 or len(counts) > 1:
                raise ValueError(
                    "model.partitions with different teachers per partition (or a different "
                    "number of partitions per rank) are not supported under "
                    "ModelParallelStrategy (FSDP2): use trainer.strategy DDPStrategy with "
                    "broadcast_buffers: false"
                )

    def setup(self, trainer: Any, statistics: Iterable[Mapping[str, Any]]) -> None:
        """A run's setup (``trainer``: its ``world_size``, ``global_rank``, ``strategy``): place
        the partitions on its ranks (:meth:`place`), refuse its strategy if it does not fit
        them (:meth:`check_strategy`), tell its datamodule the rows this rank uses
        (``use_rows``: it loads only those), all three as a
        :class:`~radio_lit.core.errors.ConfigError`, and give each teacher's statistics
        (``{teacher: Normalizer}`` mappings) the process group of the ranks that run it
        (:meth:`process_groups`; every rank calls this)."""
        try:
            self.place(trainer.world_size, trainer.global_rank)
            self.check_strategy(trainer.strategy)
            datamodule = getattr(trainer, "datamodule", None)
            if hasattr(datamodule, "use_rows"):
                datamodule.use_rows(self.rank_batch_size())
        except ValueError as error:  # the run's ranks or strategy do not fit model.partitions
            raise ConfigError(str(error)) from error
        if self.single:
            return
        for name, (group, source) in self.process_groups().items():
            for kind in statistics:
                if name in kind:
                    kind[name].set_process_group(group, source)

    def grid(self, resolution: tuple[int, int] | None = None) -> tuple[int, int]:
        """The student's patch grid ``(h, w)`` at ``resolution`` (default: the module's)."""
        height, width = resolution or self.default_resolution
        return height // self.patch_size, width // self.patch_size

    def idle_teachers(self) -> list[str]:
        """Teachers that no partition of this rank runs in training."""
        rank = self.placement.rank
        return [t for t, rs in self.placement.teacher_ranks.items() if rank not in rs]
