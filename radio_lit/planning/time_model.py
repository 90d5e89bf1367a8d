"""A step's time from each operation's own shapes against a device's measured curves
(``radio-lit plan --calibration FILE``, written by ``radio-lit plan --calibrate``:
:mod:`radio_lit.planning.calibrate`).

A roofline with measured efficiencies, per operation the step counted
(:class:`~radio_lit.planning.counting.OpRecord`):

- a matrix product ``(M, N, K, dtype)``: its FLOPs at the FLOP/s measured at the nearest
  measured shapes of its dtype, interpolated in ``(log M, log N, log K)`` (inverse distance
  over the three nearest) [choice];
- an attention kernel ``(sequence, head dim, forward or backward)``: its FLOPs at the FLOP/s
  interpolated likewise in ``(log sequence, log head dim)``;
- every other operation: the bytes it reads and writes at the measured memory bandwidth
  (FSDP2's own copies of its buffers among them: :func:`~radio_lit.planning.counting.fsdp2_copies`);
- every operation dispatched: the host's measured cost of one (Python, dispatch, a kernel
  launch), fitted on a real training step (``op_us``);
- the optimizer: 28 bytes per local float32 parameter
  (:data:`~radio_lit.planning.devices.OPTIMIZER_BYTES_PER_PARAMETER`) at a measured
  optimizer step's rate (a file without one: the copy's bandwidth);
- FSDP2's host work per sharded parameter tensor and step (its hooks, copies, ``DTensor``
  gradients and the optimizer's ``DTensor`` dispatch), where the file measured it;
- the collectives, where the file measured them (gloo on a CPU): each at its measured
  bandwidth and latency (:func:`~radio_lit.planning.communication.communication`).

A dtype the file did not measure is priced at the closest one it did (float16 for bfloat16
and back, else float32), and said so (``extrapolated``).

A file measured on one GPU of ``devices.yaml`` and planned for another is scaled by the two
GPUs' peaks (:meth:`TimeModel.on`), as the shipped per-phase calibrations are; one measured on
a device the table lacks (a CPU) prices its own rates, and the plan says so.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from radio_lit.core.errors import ConfigError
from radio_lit.core.yaml_files import read_mapping
from radio_lit.planning.counting import OTHER, OpRecord, StepCount
from radio_lit.planning.devices import (
    OPTIMIZER_BYTES_PER_PARAMETER,
    SHIPPED,
    Calibration,
    calibration,
    device,
    device_names,
)

__all__ = ["TimeModel", "load_calibration", "load_time_model", "measured_gpu", "nearest"]

#: Other dtypes to price an unmeasured one at, in order.
_FALLBACK = {"bfloat16": ["float16", "float32"], "float16": ["bfloat16", "float32"]}


def nearest(points: Sequence[Sequence[float]], where: Sequence[float]) -> float:
    """The last value of ``points`` (rows ``[*coordinates, value]``) interpolated at ``where``:
    inverse squared distance in log coordinates over the three nearest rows (a measured shape
    itself: its value)."""
    target = [math.log(max(w, 1e-9)) for w in where]
    scored = []
    for row in points:
        logs = [math.log(max(c, 1e-9)) for c in row[:-1]]
        scored.append((sum((a - b) ** 2 for a, b in zip(logs, target, strict=True)), row[-1]))
    scored.sort(key=lambda s: s[0])
    if scored[0][0] < 1e-12:
        return float(scored[0][1])
    weights = [(1 / d, v) for d, v in scored[:3]]
    return sum(w * v for w, v in weights) / sum(w for w, _ in weights)


def measured_gpu(name: str) -> str | None:
    """The key of ``devices.yaml``'s GPU that the device ``name`` (``torch.cuda``'s) is, as a
    word of it: ``h100`` for ``NVIDIA H100 80GB HBM3`` (not ``h200`` for a GH200); ``None`` for
    a device the table lacks (a CPU, another GPU)."""
    lower = name.lower()
    return next((k for k in device_names() if re.search(rf"\b{re.escape(k)}\b", lower)), None)


@dataclass(frozen=True)
class TimeModel:
    """A device's measured curves (the calibration file's keys).

    Attributes:
        device: the device measured (``torch.cuda.get_device_name`` or the CPU's name).
        gemm: ``{dtype: [[M, N, K, TFLOP/s], ...]}``.
        attention: ``{dtype: [[sequence, head dim, backward (0 or 1), TFLOP/s], ...]}``.
        memory_gb_per_s: the other operations' bandwidth (bytes read plus written per second).
        op_us: the host's microseconds per dispatched operation.
        source: what was measured, when, with which versions and commit.
        collectives: ``{op: [GB/s of the bytes a rank sends, latency ms]}`` where measured
            (gloo on a CPU); empty: the device's link bandwidths.
        copy_gb_per_s: a large copy's bandwidth (0: not measured).
        optimizer_gb_per_s: a fused AdamW step's rate in its 28 bytes a parameter (0: not
            measured; the copy's bandwidth stands for it).
        fsdp2_us_per_tensor: FSDP2's host microseconds per sharded parameter tensor and step
            beyond its collectives (gloo on a CPU; 0: not measured, as on CUDA, where the
            host's work overlaps the GPU's).
        scaled_to: the GPU key (``devices.yaml``) whose peaks the rates were scaled to from
            the measured GPU's (:meth:`on`); empty: the rates as measured.
    """

    device: str
    gemm: dict[str, list[list[float]]]
    attention: dict[str, list[list[float]]]
    memory_gb_per_s: float
    op_us: float
    source: str
    extrapolated: set[str] = field(default_factory=set, compare=False)
    collectives: dict[str, list[float]] = field(default_factory=dict)
    copy_gb_per_s: float = 0.0
    optimizer_gb_per_s: float = 0.0
    fsdp2_us_per_tensor: float = 0.0
    scaled_to: str = ""

    def on(self, gpu: str) -> TimeModel:
        """This model for the GPU ``gpu`` (a ``devices.yaml`` key): itself where that GPU
        measured it, or where the measured device or ``gpu`` is not in the table (a CPU, a
        ``--gpu`` file); else its rates scaled by the two GPUs' peaks [choice: the shipped
        per-phase calibrations' extrapolation]: matrix products and attention kernels (of
        every dtype) by the dense bf16 peaks' ratio, the other operations, copies and the
        optimizer by the memory bandwidths'; the host's cost per operation and FSDP2's per
        tensor as measured (a host's, not a GPU's)."""
        measured, planned = measured_gpu(self.device), gpu.lower()
        if measured is None or measured == planned or planned not in device_names():
            return self
        source, target = device(measured), device(planned)
        compute = target.bf16_tflops / source.bf16_tflops
        memory = target.memory_tb_per_s / source.memory_tb_per_s

        def scaled(table: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
            return {k: [[*r[:-1], r[-1] * compute] for r in rows] for k, rows in table.items()}

        return dataclasses.replace(
            self,
            gemm=scaled(self.gemm),
            attention=scaled(self.attention),
            memory_gb_per_s=self.memory_gb_per_s * memory,
            copy_gb_per_s=self.copy_gb_per_s * memory,
            optimizer_gb_per_s=self.optimizer_gb_per_s * memory,
            extrapolated=set(),
            scaled_to=planned,
        )

    def _rows(self, table: Mapping[str, list[list[float]]], dtype: str, what: str) -> list:
        if dtype in table:
            return table[dtype]
        for other in [*_FALLBACK.get(dtype, []), "float32", *table]:
            if other in table:
                self.extrapolated.add(f"{what} {dtype} priced at {other}")
                return table[other]
        raise ConfigError(f"--calibration: no {what} measured in {self.source}; run --calibrate")

    def price(self, ops: OpRecord) -> dict[str, float]:
        """Milliseconds by part of the operations ``ops`` records (module docstring)."""
        seconds: Counter[str] = Counter()
        for (part, m, n, k, dtype), flops in ops.gemms.items():
            rate = nearest(self._rows(self.gemm, dtype, "gemm"), [m, n, k])
            seconds[part] += flops / (rate * 1e12)
        for (part, _, query, key, dim, dtype, backward), flops in ops.attention.items():
            rows = [r for r in self._rows(self.attention, dtype, "attention") if r[2] == backward]
            rate = nearest([[r[0], r[1], r[3]] for r in rows], [max(query, key), dim])
            seconds[part] += flops / (rate * 1e12)
        for part, moved in ops.moved.items():
            seconds[part] += moved / (self.memory_gb_per_s * 1e9)
        for part, calls in ops.calls.items():
            seconds[part] += calls * self.op_us * 1e-6
        return {part: s * 1e3 for part, s in seconds.items()}

    def cost(self, count: StepCount) -> dict[str, float]:
        """What :mod:`radio_lit.planning.plan` adds over the draws: ms by part."""
        return self.price(count.ops)

    def times(
        self, cost: Mapping[str, float], parameters: float, sharded_tensors: int = 0
    ) -> dict[str, float]:
        """A rank's step by phase (ms) from :meth:`cost`, its local trainable parameters and
        the parameter tensors FSDP2 shards (0: not FSDP2). The optimizer: its bytes at the
        measured optimizer's rate (a fused step, or a ``foreach`` one over FSDP2's ``DTensor``
        shards: :func:`radio_lit.training.optim`'s choice, whose dispatch per tensor is in
        FSDP2's host cost); FSDP2's host cost per tensor in ``rest``."""
        teachers = sum(v for p, v in cost.items() if p.startswith(("teacher ", "upsampler ")))
        other = sum(v for p, v in cost.items() if p == OTHER)
        bandwidth = self.optimizer_gb_per_s or self.copy_gb_per_s or self.memory_gb_per_s
        optimizer = parameters * OPTIMIZER_BYTES_PER_PARAMETER / (bandwidth * 1e9)
        return {
            "teachers": teachers,
            "student": sum(cost.values()) - teachers - other,
            "optimizer": optimizer * 1e3,
            "rest": other + sharded_tensors * self.fsdp2_us_per_tensor * 1e-3,
        }

    @property
    def basis(self) -> str:
        return f"measured on {self.device} ({self.source})"


def load_time_model(path: str | Path) -> TimeModel:
    """The calibration file ``path`` (``radio-lit plan --calibrate``'s); a missing file or key
    is a :class:`ConfigError` naming it and the fix."""
    where = Path(path)
    if not where.is_file():
        raise ConfigError(
            f"--calibration {path}: no such file (write one: radio-lit plan --calibrate)"
        )
    row = read_mapping(where, "--calibration")
    needed = ["device", "gemm", "attention", "memory_gb_per_s", "op_us"]
    missing = [k for k in needed if k not in row]
    if missing:
        raise ConfigError(
            f"--calibration {path}: missing {', '.join(missing)} (a file of radio-lit plan "
            "--calibrate)"
        )
    measured = row.get("measured") or {}
    source = f"{where.name}: {measured.get('date', '?')}, commit {measured.get('commit', '?')}"
    try:
        return TimeModel(
            device=str(row["device"]),
            gemm={str(k): [list(map(float, r)) for r in v] for k, v in row["gemm"].items()},
            attention={
                str(k): [list(map(float, r)) for r in v] for k, v in row["attention"].items()
            },
            memory_gb_per_s=float(row["memory_gb_per_s"]),
            op_us=float(row["op_us"]),
            source=source,
            copy_gb_per_s=float(row.get("copy_gb_per_s", 0.0)),
            optimizer_gb_per_s=float(row.get("optimizer_gb_per_s", 0.0)),
            fsdp2_us_per_tensor=float(row.get("fsdp2_us_per_tensor", 0.0)),
            collectives={
                str(k): [float(v) for v in r] for k, r in (row.get("collectives") or {}).items()
            },
        )
    except (AttributeError, TypeError, ValueError) as error:
        raise ConfigError(
            f"--calibration {path}: a value is not what radio-lit plan --calibrate writes "
            f"({error}); measure it again: radio-lit plan --calibrate {path}"
        ) from error


def load_calibration(given: str | None) -> Calibration | TimeModel:
    """``--calibration``'s: a shipped per-phase calibration by name (``h100``, the default;
    ``h200``), a per-phase file (``teachers:``, ``student:``... as ``calibration.yaml``), or a
    file of ``--calibrate`` (:func:`load_time_model`)."""
    if given is None or given.lower() in SHIPPED:
        return calibration(SHIPPED[(given or "h100").lower()])
    where = Path(given)
    if where.is_file() and "teachers" in read_mapping(where, "--calibration"):
        return calibration(where)
    return load_time_model(where)
