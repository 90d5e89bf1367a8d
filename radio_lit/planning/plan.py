"""What one training stage costs at ``N`` GPUs: memory per rank, step time, images/s, GPU-hours,
the teacher cache's disk (``radio-lit plan``).

Counted, not estimated by hand (:mod:`radio_lit.planning.counting`): each distinct rank's step
(the partitions it runs, at their largest resolution) on fake tensors gives its FLOPs by part
and its activation peak; a partition with several resolutions is counted once more at each of
its other resolutions (the rank's other partitions at their largest), for the step time
averaged over the draws. The rest is arithmetic stated here:

**Memory per rank** (bytes): the trainable parameters ``P`` (student, heads, balancer) in
their float32 master copy and the optimizer's state (two moments for Adam, AdamW, LAMB; one
for SGD with momentum, Lion), each divided by the ``N`` data-parallel ranks under FSDP2
(``ModelParallelStrategy``; teachers are never sharded), whole under DDP, whose gradient
buckets hold a float32 copy of the gradients; the EMA student (MESA) sharded like the
student; every teacher's weights in its own dtype (each rank holds all of them); plus the
counted step peak at the largest draws (activations, temporaries, autocast's bf16 weight
copies or FSDP2's bf16 gathered weights, the gradients: the previous step's through the
forward, since Lightning's loop frees them with ``zero_grad`` only between ``training_step``
and ``backward``, then this step's as the backward produces them; counted there, not beside
the weights).

**Step time** (one rank; the step is the slowest rank's, since ranks meet at the gradients'
collective): against a per-phase calibration (``calibration.yaml``, the H100 run, the default;
``calibration-h200.yaml``: :meth:`~radio_lit.planning.devices.Calibration.times`), teachers'
FLOPs at the calibrated teacher efficiency of the GPU's bf16 peak, the student's forward,
heads, EMA student and backward at the student efficiency, the optimizer's 28 bytes per local
parameter at the calibrated fraction of the memory bandwidth, a fixed rest per step; against
a device's measured curves (``--calibration FILE`` of ``radio-lit plan --calibrate``), each
operation priced by its own shapes (:mod:`radio_lit.planning.time_model`); then the
collectives not overlapped [choice: an upper bound; FSDP2's prefetch and DDP's buckets hide
part of them].
Images/s, GPU-hours and wall time take the step **averaged over the resolution draws**
(each partition's ``probabilities``, uniform by default): the expected slowest rank over
every combination of the partitions' draws [choice: partitions draw independently; ranks of
the same partitions draw alike, as one global RNG seeded alike on every rank does]. The step
at the largest draws is reported beside it. Each rank's work averaged over the draws, the share
of the GPU-time that ranks wait for the slowest and the GPU-hours it costs are reported with it
(:mod:`radio_lit.planning.layout`).

**Communication** and the cache's reads: :mod:`radio_lit.planning.communication`; the memory
verdict, the time range, the assumptions and each figure's basis:
:mod:`radio_lit.planning.verdict`.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from radio_lit.planning.communication import cache_read, collectives, communication
from radio_lit.planning.counting import StepCount
from radio_lit.planning.devices import Calibration, Device
from radio_lit.planning.layout import layout_name, rank_counts, waiting, waiting_lines
from radio_lit.planning.time_model import TimeModel
from radio_lit.planning.verdict import UNEXPLAINED_PEAK_SHARE, basis, memory_verdict, time_range

__all__ = [
    "LoopStep",
    "RankPlan",
    "StagePlan",
    "DrawFlops",
    "cache_bytes_per_view",
    "distinct_ranks",
    "draw_chances",
    "optimizer_states",
    "plan_stage",
    "recipe_total",
    "strategy_name",
    "table",
]

GIB = 2**30
#: Bytes of one float32 value.
FP32 = 4


def _bytes(module: nn.Module | None, buffers: bool = True) -> int:
    if module is None:
        return 0
    tensors = [*module.parameters(), *(module.buffers() if buffers else ())]
    return sum(t.numel() * t.element_size() for t in tensors)


def _bytes_once(modules: Any) -> int:
    """Bytes of the parameters and buffers of ``modules``, a tensor they share counted once
    (RADIO entries of one source hold one model: ``RADIOTeacher``'s share)."""
    tensors = {id(t): t for m in modules for t in [*m.parameters(), *m.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def shared_teachers(teachers: Mapping[str, nn.Module]) -> list[list[str]]:
    """The groups of two or more teacher entries that hold one model (the same parameters)."""
    groups: dict[int, list[str]] = {}
    for name, teacher in teachers.items():
        first = next(teacher.parameters(), None)
        groups.setdefault(id(first) if first is not None else id(teacher), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _count(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def optimizer_states(class_path: str) -> int:
    """Float32 values of optimizer state per parameter: 2 (Adam, AdamW, LAMB: two moments;
    the default, radio-lit's AdamW), 1 (SGD, Lion: one)."""
    name = class_path.rsplit(".", 1)[-1].lower()
    return 1 if name in ("sgd", "lion") else 2


@dataclass
class RankPlan:
    """One rank's step (the first rank of its partitions) at the largest draws: its images,
    resolutions, FLOPs per image by part, memory (GiB) and time (ms) by part; its time
    averaged over the resolution draws (``mean_step_ms``); whether its counted memory fits
    (``fits``), the verdict with the unexplained share of the step peak and the memory's
    range (:func:`~radio_lit.planning.verdict.memory_verdict`)."""

    rank: int
    partitions: list[str]
    images: dict[str, int]
    resolutions: dict[str, list[int]]
    flops_per_image: dict[str, float]
    memory_gib: dict[str, float]
    step_ms: dict[str, float]
    mean_step_ms: float
    fits: bool
    verdict: str
    memory_range_gib: list[float]


@dataclass
class StagePlan:
    """A stage at ``gpus`` GPUs (see the module docstring); ``asdict`` is ``--json``'s.
    ``step_ms`` (with the collectives) is averaged over the resolution draws, as are the
    images/s, GPU-hours and wall time; ``largest_step_ms`` is the step at the largest draws."""

    config: str
    step: int | None
    trunk_frozen: bool
    estimating: bool
    gpu: dict[str, Any]
    gpus: int
    strategy: str
    precision: str
    max_steps: int | None
    parameters: dict[str, Any]
    ranks: list[RankPlan]
    communication: dict[str, float]
    step_ms: float
    largest_step_ms: float
    images_per_step: int
    images_per_s_per_gpu: float
    cached_step_ms: float
    gpu_hours: float | None
    wall_hours: float | None
    cache: dict[str, Any]
    calibration: str
    step_ms_range: list[float] = field(default_factory=list)
    gpu_hours_range: list[float] | None = None
    cache_read: dict[str, float] = field(default_factory=dict)
    assumptions: list[dict[str, str]] = field(default_factory=list)
    basis: dict[str, str] = field(default_factory=dict)
    #: ``"blocks"``, ``"balanced"`` or ``"mixed"`` (:func:`radio_lit.planning.layout.layout_name`)
    layout: str = "blocks"
    #: the ranks' mean work and waiting (:func:`radio_lit.planning.layout.waiting`)
    waiting: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cache_bytes_per_view(module: Any, crop_size: int, dtype: torch.dtype) -> dict[str, int]:
    """Bytes one cached view takes (``radio-lit cache``'s layout, :mod:`radio_lit.cache`): the
    uint8 crop, and per teacher its features ``[H, W, C]`` and summary ``[C]`` in ``dtype`` at
    every view size the run's partitions give it (tar headers left out: 1 KiB a sample)."""
    from radio_lit.cache.manifest import view_sizes

    size = torch.empty((), dtype=dtype).element_size()
    sizes = view_sizes(module.teachers, module.partitions, module.student.patch_size)
    out = {"pixels": 3 * crop_size * crop_size}
    for name, teacher in module.teachers.items():
        values = 0
        for height, width in sizes[name]:
            grid = (height // teacher.patch_size) * (width // teacher.patch_size)
            values += grid * teacher.feature_dim + (teacher.summary_dim or 0)
        out[name] = values * size
    return out


def strategy_name(trainer: Any) -> str:
    """``"FSDP2"`` (``ModelParallelStrategy``), ``"DDP"`` or ``"one device"``: ``trainer``'s."""
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    if isinstance(trainer.strategy, ModelParallelStrategy):
        return "FSDP2"
    if isinstance(trainer.strategy, DDPStrategy):
        return "DDP"
    return "one device"


@dataclass(frozen=True)
class LoopStep:
    """Which training step is planned: what Lightning's loop holds beside it.

    Attributes:
        step: the optimizer step (``None``: a step after every warm-up, the run's largest).
        freeze_steps: :class:`~radio_lit.callbacks.FreezeBody`'s ``steps`` in the config (0
            without it): before them the trunk's gradients are dropped before every
            optimizer step, so neither they nor the trunk's optimizer state exist.
        statistics_steps: :class:`~radio_lit.callbacks.TeacherStatsEstimation`'s ``steps``
            (0 without it): before them every step accumulates the teacher statistics and
            all-reduces them.
    """

    step: int | None = None
    freeze_steps: int = 0
    statistics_steps: int = 0

    @property
    def first(self) -> bool:
        """Step 0: no earlier step's gradients, no optimizer state yet (made lazily)."""
        return self.step == 0

    @property
    def trunk_frozen(self) -> bool:
        return self.step is not None and self.step < self.freeze_steps

    @property
    def estimating(self) -> bool:
        """A step of teacher statistics estimation."""
        return self.step is not None and self.step < self.statistics_steps

    def updated_bytes(self, module: Any) -> int:
        """Bytes of the parameters whose gradients outlive the step and hold optimizer
        state: every trainable one, less the trunk while it is held, none at step 0."""
        if self.first:
            return 0
        trainable = sum(p.numel() * p.element_size() for _, p in module.trainable_parameters())
        if self.trunk_frozen:
            trainable -= _bytes(module.student, buffers=False)
        return trainable


def _memory(
    module: Any, count: StepCount, strategy: str, gpus: int, states: int, loop: LoopStep
) -> dict[str, float]:
    trainable = sum(p.numel() * p.element_size() for _, p in module.trainable_parameters())
    shards = gpus if strategy == "FSDP2" else 1
    memory = {
        "student and heads": trainable / shards,
        "DDP buckets": trainable if strategy == "DDP" else 0,  # gradients: in the step peak
        "optimizer state": states * loop.updated_bytes(module) / shards,
        "EMA student": _bytes(getattr(module, "ema", None)) / shards,
        "teachers": _bytes_once(module.teachers.values()),
        "step peak": count.peak_bytes,
    }
    out = {k: v / GIB for k, v in memory.items()}
    out["total"] = sum(out.values())
    return out


def _times(
    module: Any,
    cost: Mapping[str, float],
    strategy: str,
    gpus: int,
    device: Device,
    fit: Calibration | TimeModel,
) -> dict[str, float]:
    """A rank's step time by phase (ms) from its cost by part (``fit.cost``: FLOPs against a
    per-phase calibration, milliseconds against a :class:`TimeModel`)."""
    trainable = [p for _, p in module.trainable_parameters()]
    local = sum(p.numel() for p in trainable) / (gpus if strategy == "FSDP2" else 1)
    if isinstance(fit, TimeModel):
        return fit.times(cost, local, len(trainable) if strategy == "FSDP2" else 0)
    return fit.times(cost, local, device)


#: ``{rank: {(partition, resolution index): FLOPs by part}}``: each distinct rank's step
#: counted with one partition at one of its other resolutions (the rest at their largest).
DrawFlops = Mapping[int, Mapping[tuple[str, int], Mapping[str, int]]]


def draw_chances(partitions: Any) -> dict[str, list[float]]:
    """``{partition: chance of each resolution}`` of the partitions with several: their
    ``probabilities`` normalised (``torch.multinomial``'s), uniform without."""
    out = {}
    for name, sizes in partitions.resolutions.items():
        if len(sizes) > 1:
            given = partitions.partitions[name].probabilities or [1.0] * len(sizes)
            out[name] = [c / sum(given) for c in given]
    return out


def _draw_steps(
    base: Mapping[int, Mapping[str, int]], draws: DrawFlops, chances: Mapping[str, list[float]]
) -> Iterator[tuple[float, dict[int, dict[str, float]]]]:
    """``(chance, {rank: FLOPs by part})`` of every combination of the partitions' draws
    (module docstring): a rank's FLOPs at the largest draws plus, for each of its partitions
    drawn below its largest, that draw's counted difference."""
    names = list(chances)
    for combo in itertools.product(*(range(len(chances[n])) for n in names)):
        chance = math.prod(chances[n][i] for n, i in zip(names, combo, strict=True))
        steps = {}
        for rank, flops in base.items():
            total: Counter[str] = Counter(flops)
            for name, index in zip(names, combo, strict=True):
                drawn = draws.get(rank, {}).get((name, index))
                if drawn is not None:
                    total.update(drawn)
                    total.subtract(flops)
            steps[rank] = dict(total)
        yield chance, steps


def _parameters(module: Any) -> dict[str, Any]:
    teachers, upsamplers = {}, {}
    for name, teacher in module.teachers.items():
        upsampler = getattr(teacher, "upsampler", None)
        teachers[name] = _count(teacher) - _count(upsampler)
        if isinstance(upsampler, nn.Module):
            upsamplers[name] = _count(upsampler)
    out: dict[str, Any] = {
        "student": _count(module.student),
        "heads": {name: _count(head) for name, head in module.heads.items()},
        "teachers": teachers,
    }
    if upsamplers:
        out["upsamplers"] = upsamplers
    shared = shared_teachers(module.teachers)
    if shared:
        out["one model"] = shared
    if getattr(module, "ema", None) is not None:
        out["EMA student"] = _count(module.ema)
    return out


def _advice(module: Any, rank: RankPlan, device: Device, strategy: str) -> str:
    """The warning of a rank that does not fit: by how much, and what to change first."""
    memory = rank.memory_gib
    over = memory["total"] - device.memory_gib
    biggest = max(rank.images, key=lambda p: rank.images[p] * math.prod(rank.resolutions[p]))
    fixes = [
        f"model.partitions.{biggest}.batch_size (its {rank.images[biggest]} images per rank) or "
        f"its largest resolution ({rank.resolutions[biggest][0]} px): the step peak "
        f"{memory['step peak']:.1f} GiB grows with both",
        "activation checkpointing of the student (not in radio-lit yet) would keep a fraction "
        "of its activations",
    ]
    float_teachers = [
        n
        for n, t in module.teachers.items()
        if next(t.parameters(), torch.empty(0)).dtype == torch.float32
    ]
    if float_teachers:
        fixes.append(
            "model.teachers.<name>.init_args.dtype: bfloat16 for "
            + ", ".join(float_teachers)
            + " (half their weights)"
        )
    if strategy != "FSDP2":
        fixes.append(
            "trainer.strategy radio_lit.distributed.strategies.ModelParallelStrategy (FSDP2 "
            "shards the student, its gradients and optimizer state)"
        )
    return (
        f"rank {rank.rank} ({', '.join(rank.partitions)}) needs {memory['total']:.1f} GiB, "
        f"{over:.1f} GiB more than the {device.memory_gib:.1f} GiB of a {device.name}: "
        "lower " + "; or ".join(fixes)
    )


def _may_not_fit(rank: RankPlan, device: Device) -> str:
    """The warning of a rank whose counted memory fits but not with the share of its step
    peak the plan has missed on GPUs (:mod:`radio_lit.planning.verdict`)."""
    low, high = rank.memory_range_gib
    shares = "-".join(f"{s:.0%}" for s in UNEXPLAINED_PEAK_SHARE)
    return (
        f"rank {rank.rank} ({', '.join(rank.partitions)}) may not fit: counted "
        f"{rank.memory_gib['total']:.1f} GiB of the {device.memory_gib:.1f} GiB of a "
        f"{device.name}, {low:.1f}-{high:.1f} GiB with the {shares} of its step peak the plan "
        'has missed on GPUs (benchmarks/README.md, "plan"); leave that headroom (a smaller '
        "batch or resolution of its largest partition)"
    )


def distinct_ranks(partitions: Any, gpus: int) -> list[int]:
    """The first rank of each set of partitions a rank runs at ``gpus`` ranks (a
    :class:`~radio_lit.training.partitions.PartitionPlan`); ``ValueError`` when a partition's
    batch does not split over its ranks."""
    placement = partitions.place(gpus, 0)
    runs: dict[tuple[str, ...], int] = {}
    for rank in range(gpus):
        mine = tuple(p for p, ranks in placement.ranks.items() if rank in ranks)
        runs.setdefault(mine, rank)
    return list(runs.values())


def plan_stage(
    module: Any,
    trainer: Any,
    counts: Mapping[int, StepCount],
    *,
    draws: DrawFlops | None = None,
    loop: LoopStep = LoopStep(),
    config: str,
    gpus: int,
    device: Device,
    fit: Calibration | TimeModel,
    optimizer: Mapping[str, Any],
    data_batch: int,
    crop_size: int,
    cache_images: int,
    cache_dtype: torch.dtype,
    assumptions: Sequence[Mapping[str, str]] = (),
    gpu_key: str = "",
) -> StagePlan:
    """The stage's plan from the counted steps of its distinct ranks (``{rank: count}``, at
    the largest draws) and of their other draws (``draws``: :data:`DrawFlops`; ``None``:
    every partition at one resolution)."""
    strategy = strategy_name(trainer)
    if gpus > 1 and strategy == "one device":
        strategy = "DDP"  # Lightning's default for several devices
    states = optimizer_states(str(optimizer.get("class_path", "AdamW")))
    partitions = module.partitions
    partitions.place(gpus, 0)
    chances = draw_chances(partitions) if draws else {}  # none counted: the largest only
    combos = list(_draw_steps({r: fit.cost(c) for r, c in counts.items()}, draws or {}, chances))

    def time(flops: Mapping[str, float]) -> dict[str, float]:
        return _times(module, flops, strategy, gpus, device, fit)

    mean_step = mean_cached = 0.0  # the slowest rank, averaged over the draws
    rank_means = dict.fromkeys(counts, 0.0)
    for chance, steps in combos:
        totals = {r: time(f) for r, f in steps.items()}
        for r, parts in totals.items():
            rank_means[r] += chance * sum(parts.values())
        mean_step += chance * max(sum(parts.values()) for parts in totals.values())
        mean_cached += chance * max(sum(p.values()) - p["teachers"] for p in totals.values())
    ranks, step = [], 0.0
    for rank, count in counts.items():
        memory = _memory(module, count, strategy, gpus, states, loop)
        verdict, memory_range = memory_verdict(memory, device.memory_gib)
        times = time(fit.cost(count))
        times["total"] = sum(times.values())
        step = max(step, times["total"])
        images = max(count.total_images, 1)
        ranks.append(
            RankPlan(
                rank=rank,
                partitions=list(count.images),
                images=count.images,
                resolutions={p: list(r) for p, r in count.resolutions.items()},
                flops_per_image={p: f / images for p, f in sorted(count.flops.items())},
                memory_gib=memory,
                step_ms=times,
                mean_step_ms=rank_means[rank],
                fits=memory["total"] <= device.memory_gib,
                verdict=verdict,
                memory_range_gib=memory_range,
            )
        )
    precision = str(trainer.precision)
    low = torch.bfloat16 if precision.startswith("bf16") else None
    low = torch.float16 if precision.startswith("16") else low
    found = collectives(module, strategy, gpus, low, optimizer, loop.estimating)
    comm = communication(found, gpus, device, getattr(fit, "collectives", None))
    largest_step = step + comm["ms"]
    step = mean_step + comm["ms"]
    batches = [p.batch_size for p in partitions.partitions.values()]
    per_step = sum(batches) if None not in batches else data_batch * gpus
    max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
    hours = None if max_steps is None else max_steps * step / 1e3 / 3600
    per_view = cache_bytes_per_view(module, crop_size, cache_dtype)
    images_per_rank = max(c.total_images for c in counts.values())
    read = cache_read(per_view, images_per_rank, gpus, device)
    # the loader's workers read ahead of the step: the slower of the two [choice]
    cached = max(mean_cached + comm["ms"], read["ms"])
    cache = {
        "images": cache_images,
        "dtype": str(cache_dtype).removeprefix("torch."),
        "bytes_per_view": per_view,
        "total_tb": cache_images * (sum(per_view.values()) + 1024) / 1e12,
    }
    stage = StagePlan(
        config=config,
        step=loop.step,
        trunk_frozen=loop.trunk_frozen,
        estimating=loop.estimating,
        gpu=asdict(device),
        gpus=gpus,
        strategy=strategy,
        precision=str(trainer.precision),
        max_steps=max_steps,
        parameters=_parameters(module),
        ranks=ranks,
        communication=comm,
        step_ms=step,
        largest_step_ms=largest_step,
        images_per_step=per_step,
        images_per_s_per_gpu=per_step / (step / 1e3) / gpus,
        cached_step_ms=cached,
        gpu_hours=None if hours is None else hours * gpus,
        wall_hours=hours,
        cache=cache,
        calibration=fit.basis,
        step_ms_range=time_range(step),
        gpu_hours_range=None
        if hours is None
        else [h / step * hours * gpus for h in time_range(step)],
        cache_read=read,
        assumptions=[dict(a) for a in assumptions],
        basis=basis(device.name, fit, gpu_key or device.name),
        layout=layout_name(partitions)
        + (", packed" if any(c.packed_kernel for c in counts.values()) else ""),
    )
    counted = {r: n for r, n in rank_counts(partitions, gpus).items() if r in rank_means}
    stage.waiting = waiting(rank_means, counted, step, comm["ms"], stage.gpu_hours)
    stage.warnings = [_advice(module, r, device, strategy) for r in ranks if not r.fits]
    stage.warnings += [_may_not_fit(r, device) for r in ranks if r.verdict == "may not fit"]
    return stage


def recipe_total(stages: Sequence[StagePlan]) -> dict[str, float | None]:
    """GPU-hours and wall hours of the stages one after the other (``None`` if any stage has
    no ``max_steps``)."""
    if any(s.gpu_hours is None for s in stages):
        return {"gpu_hours": None, "wall_hours": None}
    return {
        "gpu_hours": sum(s.gpu_hours or 0.0 for s in stages),
        "wall_hours": sum(s.wall_hours or 0.0 for s in stages),
    }


def _fmt_parts(flops: Mapping[str, float]) -> str:
    return ", ".join(f"{p} {f / 1e9:,.1f}" for p, f in flops.items() if f)


def table(stage: StagePlan) -> str:
    """The human-readable plan of one stage (what ``radio-lit plan`` prints)."""
    gpu = stage.gpu
    held = [
        *(["trunk held by FreezeBody"] if stage.trunk_frozen else []),
        *(["teacher statistics estimated"] if stage.estimating else []),
    ]
    held_text = f" ({', '.join(held)})" if held else ""
    at = "" if stage.step is None else f" at step {stage.step:,}{held_text}"
    lines = [
        f"plan: {stage.config}{at} on {stage.gpus} x {gpu['name']} ({stage.strategy}, "
        f"{stage.precision}; {gpu['bf16_tflops']:g} TFLOP/s bf16, "
        f"{gpu['memory_tb_per_s']:g} TB/s, {gpu['memory_gib']:g} GiB)",
    ]
    params = stage.parameters
    heads = sum(params["heads"].values())
    groups = [[n] for n in params["teachers"]]
    for shared in params.get("one model", []):
        groups = [g for g in groups if g[0] not in shared[1:]]
        groups[next(i for i, g in enumerate(groups) if g[0] == shared[0])] = shared
    teachers = ", ".join(
        f"{' = '.join(g)} {params['teachers'][g[0]] / 1e6:,.1f} M{' (one model)' * (len(g) > 1)}"
        for g in groups
    )
    extra = "".join(
        f"; upsampler {n} {c / 1e6:,.1f} M" for n, c in params.get("upsamplers", {}).items()
    )
    lines.append(
        f"parameters: student {params['student'] / 1e6:,.1f} M, heads {heads / 1e6:,.1f} M; "
        f"teachers {teachers}{extra}"
    )
    lines.append("")
    names = ["student and heads", "DDP buckets", "optimizer state", "EMA student", "teachers"]
    names += ["step peak", "total"]
    header = f"{'rank (partitions)':<34}" + "".join(f"{n[:12]:>13}" for n in names)
    lines += ["memory per rank, GiB", header]
    for rank in stage.ranks:
        who = f"{rank.rank} ({', '.join(rank.partitions)})"
        cells = "".join(f"{rank.memory_gib[n]:>13.2f}" for n in names)
        low, high = rank.memory_range_gib
        lines.append(f"{who:<34}{cells}  {rank.verdict} ({low:.1f}-{high:.1f} GiB on a GPU)")
    lines.append("")
    lines.append("per rank: images, resolution, GFLOP per image by part, step ms by part")
    for rank in stage.ranks:
        where = ", ".join(
            f"{p} {rank.images[p]} x {rank.resolutions[p][0]} px" for p in rank.partitions
        )
        ms = ", ".join(f"{k} {v:,.1f}" for k, v in rank.step_ms.items())
        lines.append(f"  rank {rank.rank}: {where}")
        lines.append(f"    GFLOP/image: {_fmt_parts(rank.flops_per_image)}")
        lines.append(f"    ms: {ms}")
        if not math.isclose(rank.mean_step_ms, rank.step_ms["total"], rel_tol=1e-9):
            lines.append(f"    ms averaged over the resolution draws: {rank.mean_step_ms:,.1f}")
    comm = stage.communication
    lines.append("")
    parts = "; ".join(
        f"{c['name']} {c['op']} {c['sent_gb']:.3f} GB {c['dtype']} x{c['count']} "
        f"{c['ms']:.1f} ms ({c['latency_ms']:.1f} ms latency)"
        for c in comm["collectives"]
    )
    lines.append(
        f"communication per rank and step at {comm['link_gb_per_s']:g} GB/s: "
        f"{parts or 'none'}: {comm['ms']:.1f} ms"
    )
    drawn = not math.isclose(stage.step_ms, stage.largest_step_ms, rel_tol=1e-9)
    averaged = (
        f" averaged over the resolution draws ({stage.largest_step_ms:,.1f} ms at the largest)"
        if drawn
        else ""
    )
    low, high = stage.step_ms_range
    read = stage.cache_read
    lines.append(
        f"step: {stage.step_ms:,.1f} ms{averaged} for {stage.images_per_step:,} images "
        f"(measured likely {low:,.1f}-{high:,.1f} ms); "
        f"{stage.images_per_s_per_gpu:,.1f} images/s per GPU"
    )
    lines.append(
        f"from a full teacher cache: {stage.cached_step_ms:,.1f} ms a step (reads "
        f"{read['gb_per_node']:,.2f} GB per node and step at {read['read_gb_per_s']:g} GB/s: "
        f"{read['ms']:,.1f} ms)"
    )
    lines += waiting_lines(stage)
    if stage.max_steps is not None and stage.gpu_hours_range is not None:
        lo, hi = stage.gpu_hours_range
        lines.append(
            f"max_steps {stage.max_steps:,}: {stage.gpu_hours:,.0f} GPU-hours "
            f"(range {lo:,.0f}-{hi:,.0f}), {stage.wall_hours:,.1f} h wall at {stage.gpus} GPUs"
        )
    cache = stage.cache
    per_view = sum(cache["bytes_per_view"].values())
    lines.append(
        f"teacher cache: {per_view / 2**20:,.2f} MiB per view ({cache['dtype']}), "
        f"{cache['total_tb']:,.2f} TB for {cache['images']:,} images, one view each"
    )
    lines.append(f"calibration: {stage.calibration}")
    lines += [f"assumed {a['name']}: {a['value']} ({a['source']})" for a in stage.assumptions]
    lines += [f"basis of {k}: {v}" for k, v in stage.basis.items()]
    lines += [f"warning: {w}" for w in stage.warnings]
    return "\n".join(lines)
