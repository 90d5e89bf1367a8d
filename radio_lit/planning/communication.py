"""What a rank sends per step and how long it takes (``radio-lit plan``'s "communication" line),
and what a step from a full teacher cache reads (its "from a cache" line).

Every collective of a step, with its bytes per rank and how many times it runs
(:func:`collectives`):

- **FSDP2** (``ModelParallelStrategy``, :mod:`radio_lit.students.sharding`): each unit's
  all-gather of its weights in the ``MixedPrecisionPolicy``'s ``param_dtype`` (bfloat16 under
  ``bf16`` precision, float32 under 32-bit: the weights' own dtype), once per step (layout
  ``student``; blocks kept from forward to backward) or twice (layout ``blocks`` with
  ``reshard_after_forward``: ZeRO-3); the gradients' reduce-scatter in ``reduce_dtype``; the
  **EMA student**'s all-gather (MESA's forward, sharded like the student, forward only: once a
  step); under LAMB, the all-reduces of its norms (:func:`lamb_norms`). Each parameter is
  sharded on dim 0, padded to a multiple of the ranks: the gathered bytes are the padded ones.
- **DDP**: the float32 gradients all-reduced in 25 MB buckets (DDP's ``bucket_cap_mb``).
- Under both, **Lightning's stop check**: the training loop broadcasts one value from rank 0
  before every step (whether a rank received SIGTERM; Lightning >= 2.6), priced as an
  all-reduce of it [choice: a tree both ways, an upper bound]; and in an estimation step of
  :class:`~radio_lit.callbacks.TeacherStatsEstimation` the **teacher statistics**: each
  normalizer all-reduces its float64 sums, ``dim + 1`` values, then its scatter (``dim x dim``,
  or ``dim`` for an elementwise one; :meth:`~radio_lit.normalizers.base.Normalizer.update`).

Time per collective (ring, ``(N - 1) / N`` of the data each way; an all-reduce twice that):
bytes over the link's bandwidth (NVLink within a node, the network once ``N`` spans nodes)
plus a latency term: NCCL's base latency and one hop's latency per ring step, ``N - 1``
steps (``2 (N - 1)`` for an all-reduce), the steps between nodes at the network's hop latency
(``devices.yaml``; NCCL's tuning model, ``src/graph/tuning.cc``, Ring/Simple) [choice: no PAT
algorithm, an upper bound at large ``N``]; an all-reduce of a few bytes (LAMB's norms) as a
tree, ``2 ceil(log2 N)`` steps at the Tree/LL latencies [choice: NCCL picks LL for small
messages]. The sum is not overlapped with compute
[choice: an upper bound; FSDP2's prefetch and DDP's buckets hide part of it].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from radio_lit.planning.devices import Device

__all__ = [
    "Collective",
    "cache_read",
    "collectives",
    "communication",
    "lamb_norms",
    "padded_numel",
    "statistics_reduces",
]

#: DDP's default gradient bucket (``bucket_cap_mb=25``), bytes.
DDP_BUCKET = 25 * 2**20


@dataclass(frozen=True)
class Collective:
    """One kind of collective of a step: ``count`` of them per step, ``bytes`` the data they
    carry together (the full, gathered or reduced size, before the ring's ``(N - 1) / N``)."""

    name: str
    op: str  # "all-gather", "reduce-scatter" or "all-reduce"
    count: int
    bytes: float
    dtype: str


def padded_numel(parameters: Iterable[torch.Tensor], ranks: int) -> int:
    """Values of ``parameters`` once each is sharded on dim 0 over ``ranks`` (FSDP2 pads dim 0
    to a multiple of the ranks: ``ceil(d0 / N) * N`` rows)."""
    total = 0
    for p in parameters:
        if p.dim() == 0:
            total += ranks  # a scalar: one value per rank
            continue
        rows = math.ceil(p.shape[0] / ranks) * ranks
        total += rows * (p.numel() // max(p.shape[0], 1))
    return total


def _units(student: nn.Module, heads: Iterable[nn.Module], layout: str) -> int:
    """FSDP2 units of a student and its heads: the student (and each block under ``blocks``),
    each head's features and summary module."""
    blocks = len(getattr(student, "blocks", ())) if layout == "blocks" else 0
    return 1 + blocks + sum(1 for h in heads for m in (h.features, h.summary) if m is not None)


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def collectives(
    module: Any,
    strategy: str,
    gpus: int,
    low: torch.dtype | None,
    optimizer: Mapping[str, Any],
    estimating: bool = False,
) -> list[Collective]:
    """The collectives of one training step of ``module`` under ``strategy`` at ``gpus``
    ranks (module docstring); ``low``: autocast's dtype (``None``: 32-bit precision);
    ``optimizer``: the config's ``model.optimizer`` (``class_path``, ``init_args``);
    ``estimating``: a step of teacher statistics estimation."""
    if gpus < 2 or strategy == "one device":
        return []
    trainable = [p for _, p in module.trainable_parameters()]
    out = [Collective("stop check", "all-reduce", 1, 8, "int64")]
    if estimating:
        out += statistics_reduces(module)
    if strategy == "DDP":
        values = sum(p.numel() for p in trainable)
        grads = values * 4
        buckets = math.ceil(grads / DDP_BUCKET)
        return [Collective("gradients", "all-reduce", buckets, grads, "float32"), *out]
    settings = module.fsdp2
    gathered = low or torch.float32
    name = str(gathered).removeprefix("torch.")
    units = _units(module.student, module.heads.values(), settings.layout)
    gathers = 2 if settings.layout == "blocks" and settings.reshard_after_forward else 1
    padded = padded_numel(trainable, gpus)
    reduce = torch.bfloat16 if settings.reduce_dtype == "bfloat16" else torch.float32
    sharded = [
        Collective(
            "weights", "all-gather", gathers * units, gathers * padded * _size(gathered), name
        ),
        Collective(
            "gradients", "reduce-scatter", units, padded * _size(reduce), settings.reduce_dtype
        ),
    ]
    ema = getattr(module, "ema", None)
    mesa = getattr(getattr(module, "student_step", None), "mesa", None)
    if ema is not None and mesa is not None and mesa.weight > 0:
        weights = padded_numel(ema.student.parameters(), gpus) * _size(gathered)
        ema_units = _units(ema.student, (), settings.layout)
        sharded.append(Collective("EMA student weights", "all-gather", ema_units, weights, name))
    norms = lamb_norms(module.trainable_parameters(), optimizer)
    return [*sharded, *([norms] if norms else []), *out]


def lamb_norms(
    named: Iterable[tuple[str, nn.Parameter]], optimizer: Mapping[str, Any]
) -> Collective | None:
    """LAMB's all-reduces on FSDP2's ``DTensor`` shards (``None``: not LAMB, or none).

    A norm of a shard is a partial one, all-reduced where it is used. Counted on timm's
    ``Lamb`` (the update :class:`~radio_lit.training.lamb.Lamb` runs eagerly or compiled)
    over two gloo ranks (``tests/planning/test_communication.py``): the global gradient norm
    for clipping (``max_grad_norm`` set), one all-reduce of every tensor's norm; then, in each
    parameter group whose update is adapted (``weight_decay`` not 0, or ``always_adapt``;
    :func:`~radio_lit.training.optim.parameter_groups`), three of the group's stacked norms
    (multi-tensor step, ``foreach``) or four scalars a tensor (``foreach: false``).
    """
    if str(optimizer.get("class_path", "")).rsplit(".", 1)[-1].lower() != "lamb":
        return None
    from radio_lit.training.lamb import Lamb
    from radio_lit.training.optim import parameter_groups

    init_args = dict(optimizer.get("init_args") or {})
    defaults = Lamb([nn.Parameter(torch.zeros(1))], **init_args).defaults  # as the run resolves
    groups = parameter_groups(named)
    count = values = 0
    if defaults["max_grad_norm"] is not None:
        count, values = 1, sum(len(g["params"]) for g in groups)
    for group in groups:
        if (
            group.get("weight_decay", defaults["weight_decay"]) == 0
            and not defaults["always_adapt"]
        ):
            continue
        tensors = len(group["params"])
        count += 3 if defaults["foreach"] else 4 * tensors
        values += 3 * tensors if defaults["foreach"] else 4 * tensors
    return Collective("LAMB norms", "all-reduce", count, 4 * values, "float32") if count else None


def statistics_reduces(module: Any) -> list[Collective]:
    """The teacher statistics' all-reduces of an estimation step (module docstring): two per
    statistic (a normalizer's sums and scatter; an angular dispersion's direction sums and
    squared angles)."""
    count = values = 0
    for statistics in module.teacher_statistics().values():
        for statistic in statistics.values():
            if statistic.requires_statistics:
                second = getattr(statistic, "m2", None)  # a dispersion's: one squared angle
                count += 2
                values += statistic.dim + 1 + (second.numel() if second is not None else 1)
    if not count:
        return []
    return [Collective("teacher statistics", "all-reduce", count, 8 * values, "float64")]


#: The largest all-reduce priced as a tree of small messages (NCCL's LL protocol) [choice].
SMALL = 64 * 2**10


def _latency_ms(op: str, size: float, gpus: int, device: Device) -> float:
    """One collective's latency term at ``gpus`` ranks (module docstring): a ring of
    ``N - 1`` steps (``2 (N - 1)``: an all-reduce), or, for an all-reduce of at most
    :data:`SMALL` bytes, a tree of ``2 ceil(log2 N)`` steps at the small-message latencies."""
    nodes = math.ceil(gpus / device.gpus_per_node)
    if op == "all-reduce" and size <= SMALL:
        within = 2 * math.ceil(math.log2(min(gpus, device.gpus_per_node)))
        across = 2 * math.ceil(math.log2(nodes)) if nodes > 1 else 0
        hops = within * device.small_node_hop_us + across * device.small_network_hop_us
        return (device.small_base_us + hops) / 1e3
    steps = gpus - 1 if op != "all-reduce" else 2 * (gpus - 1)
    crossing = 0 if nodes == 1 else steps * nodes / gpus  # the ring's steps between nodes
    hops = (steps - crossing) * device.node_hop_us + crossing * device.network_hop_us
    return (device.collective_base_us + hops) / 1e3


def communication(
    found: list[Collective],
    gpus: int,
    device: Device,
    measured: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """Each collective's bytes sent per rank (GB), its count and time (ms), and the step's
    total (``ms``) at ``gpus`` ranks of ``device`` (module docstring); ``measured``: a
    calibration's ``{op: [GB/s of the bytes a rank sends, latency ms]}`` (gloo's on a CPU,
    :mod:`radio_lit.planning.calibrate`) in place of the device's link and latencies."""
    link = device.link_gb_per_s(gpus)
    ring = (gpus - 1) / gpus if gpus > 1 else 0.0
    rows, total = [], 0.0
    for c in found:
        sent = c.bytes * ring * (2 if c.op == "all-reduce" else 1)
        if measured and c.op in measured:
            rate, each = measured[c.op]
            latency, speed = c.count * each, rate
        else:
            latency = c.count * _latency_ms(c.op, c.bytes / max(c.count, 1), gpus, device)
            speed = link
        ms = sent / (speed * 1e9) * 1e3 + latency
        rows.append({**asdict(c), "sent_gb": sent / 1e9, "latency_ms": latency, "ms": ms})
        total += ms
    return {"collectives": rows, "link_gb_per_s": link, "ms": total}


def cache_read(
    bytes_per_view: Mapping[str, int], images_per_rank: int, gpus: int, device: Device
) -> dict[str, float]:
    """What a step from a full teacher cache reads: ``images_per_rank`` views a rank, the
    ranks of one node together (``min(gpus, gpus_per_node)``), at the node's read bandwidth
    (``devices.yaml``'s ``cache_read_gb_per_s``): bytes per node and step (GB) and ms
    [choice: a view's entry whole, every view size the run's partitions store in it; an upper
    bound where a rank's partition reads one of them]."""
    per_rank = images_per_rank * sum(bytes_per_view.values())
    node = per_rank * min(gpus, device.gpus_per_node)
    return {
        "gb_per_rank": per_rank / 1e9,
        "gb_per_node": node / 1e9,
        "read_gb_per_s": device.cache_read_gb_per_s,
        "ms": node / (device.cache_read_gb_per_s * 1e9) * 1e3,
    }
