"""The GPUs a plan is made for (``devices.yaml``) and what radio-lit's measured steps achieve on
them (``calibration.yaml``), both data files beside this module, each row with its source."""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from radio_lit.core.errors import ConfigError, did_you_mean
from radio_lit.core.yaml_files import read_mapping

__all__ = ["Calibration", "Device", "calibration", "device", "device_names"]

HERE = Path(__file__).resolve().parent
DEVICES = HERE / "devices.yaml"
CALIBRATION = HERE / "calibration.yaml"


@dataclass(frozen=True)
class Device:
    """One GPU: dense bf16 peak (TFLOP/s), memory bandwidth (TB/s), memory (GiB as CUDA
    reports it), GPUs per node, per-GPU collective bandwidth within a node and across nodes
    (GB/s, one direction), and where the figures come from. Optional (a device file may leave
    them out): a collective's base latency and one ring step's latency within a node and across
    nodes (µs, NCCL's tuning model, :mod:`radio_lit.planning.communication`), the same of a
    small all-reduce's tree, and a node's read bandwidth of a teacher cache (GB/s)."""

    name: str
    bf16_tflops: float
    memory_tb_per_s: float
    memory_gib: float
    gpus_per_node: int
    node_gb_per_s: float
    network_gb_per_s: float
    source: str
    collective_base_us: float = 8.4  # NCCL src/graph/tuning.cc baseLat, Ring/Simple
    node_hop_us: float = 3.4  # NCCL src/graph/tuning.cc hwLat NVLink, Ring/Simple
    network_hop_us: float = 14.0  # [choice] a network step: NVLink's and an NDR round trip
    small_base_us: float = 4.4  # NCCL tuning.cc baseLat, Tree/LL: a few bytes all-reduced
    small_node_hop_us: float = 0.52  # NCCL tuning.cc hwLat NVLink, Tree/LL
    small_network_hop_us: float = 5.0  # [choice] a network step of a Tree/LL all-reduce
    cache_read_gb_per_s: float = 25.0  # [choice] a node's local NVMe array, read

    def link_gb_per_s(self, ranks: int) -> float:
        """The bandwidth a ring collective over ``ranks`` GPUs runs at: NVLink within a node,
        the network once it spans nodes (its slowest link)."""
        return self.node_gb_per_s if ranks <= self.gpus_per_node else self.network_gb_per_s


@functools.cache
def _table() -> dict[str, Any]:
    """``devices.yaml``'s rows, read once."""
    return read_mapping(DEVICES, "devices.yaml")


def device_names() -> list[str]:
    """The names ``--gpu`` accepts from the table."""
    return list(_table())


def _device(row: Any, where: str) -> Device:
    names = [f.name for f in fields(Device) if f.default is MISSING]
    optional = [f.name for f in fields(Device) if f.default is not MISSING]
    if (
        not isinstance(row, dict)
        or not set(names) <= set(row)
        or not set(row) <= set(names + optional)
    ):
        given = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ConfigError(
            f"--gpu {where}: a device needs the keys {names} (optional: {optional}), got {given}"
        )
    return Device(**row)


def device(name: str) -> Device:
    """The table's row ``name`` (``h100``…), or a YAML file of one row's keys; an unknown name
    is a :class:`ConfigError` naming the closest and every known one."""
    table = _table()
    if name.lower() in table:
        return _device(table[name.lower()], name)
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        if not Path(name).is_file():
            raise ConfigError(f"--gpu {name}: no such file")
        return _device(read_mapping(Path(name), "--gpu"), name)
    raise ConfigError(
        f"--gpu {name}: unknown GPU{did_you_mean(name, table)}; known: {', '.join(table)} "
        "(or a YAML file with a device's keys, radio_lit/planning/devices.yaml)"
    )


@dataclass(frozen=True)
class Calibration:
    """Achieved fractions of the calibration device's peak (``calibration.yaml``): teachers'
    forwards, the student's forward and backward (heads included); the optimizer's bytes per
    second as a fraction of the memory bandwidth; a fixed cost per step (ms)."""

    teacher_efficiency: float
    student_efficiency: float
    optimizer_efficiency: float
    rest_ms: float
    source: str
    device: str = "h100"

    def cost(self, count: Any) -> dict[str, float]:
        """What the plan adds over the draws: a step count's FLOPs by part."""
        return dict(count.flops)

    def times(self, flops: dict[str, float], parameters: float, gpu: Device) -> dict[str, float]:
        """A rank's step by phase (ms): teachers' FLOPs at the teacher efficiency of ``gpu``'s
        bf16 peak, the student's forward, heads, EMA student and backward at the student
        efficiency, ``parameters`` local float32 parameters' optimizer bytes at the optimizer
        share of its bandwidth, the fixed rest."""
        peak = gpu.bf16_tflops * 1e12
        teachers = sum(f for p, f in flops.items() if p.startswith(("teacher ", "upsampler ")))
        student = sum(
            f for p, f in flops.items() if not p.startswith(("teacher ", "upsampler ", "other"))
        )
        moved = parameters * OPTIMIZER_BYTES_PER_PARAMETER
        bandwidth = gpu.memory_tb_per_s * 1e12 * self.optimizer_efficiency
        return {
            "teachers": teachers / (peak * self.teacher_efficiency) * 1e3,
            "student": student / (peak * self.student_efficiency) * 1e3,
            "optimizer": moved / bandwidth * 1e3,
            "rest": self.rest_ms,
        }

    @property
    def basis(self) -> str:
        """Where the step time comes from (the plan prints it)."""
        return (
            f"calibrated on {self.device} per phase ({self.source}); other GPUs, models and "
            "shapes extrapolated at those efficiencies"
        )


#: Bytes a LAMB / AdamW step reads and writes per float32 parameter: the parameter and its two
#: moments read and written, the gradient read (7 x 4 bytes).
OPTIMIZER_BYTES_PER_PARAMETER = 28


#: The per-phase calibrations shipped beside this module, by the ``--calibration`` name.
SHIPPED = {"h100": CALIBRATION, "h200": HERE / "calibration-h200.yaml"}


def calibration(path: Path = CALIBRATION) -> Calibration:
    """A per-phase calibration file (``calibration.yaml``: the H100 run; the default); one
    without its keys is a :class:`ConfigError` naming them."""
    row = read_mapping(path, "--calibration")

    def refused(reason: str) -> ConfigError:
        return ConfigError(
            f"--calibration {path}: not a per-phase calibration ({reason}); it needs device, "
            "source, teachers and student {gflop, ms}, optimizer {parameters, ms}, rest {ms} "
            "(as radio_lit/planning/calibration.yaml)"
        )

    missing = [
        k for k in ("device", "source", "teachers", "student", "optimizer", "rest") if k not in row
    ]
    if missing:
        raise refused(f"missing {', '.join(missing)}")
    try:
        base = device(row["device"])
        peak = base.bf16_tflops * 1e12

        def efficiency(part: dict[str, float]) -> float:
            return part["gflop"] * 1e9 / (part["ms"] / 1e3) / peak

        moved = row["optimizer"]["parameters"] * OPTIMIZER_BYTES_PER_PARAMETER
        optimizer = moved / (row["optimizer"]["ms"] / 1e3) / (base.memory_tb_per_s * 1e12)
        return Calibration(
            teacher_efficiency=efficiency(row["teachers"]),
            student_efficiency=efficiency(row["student"]),
            optimizer_efficiency=optimizer,
            rest_ms=float(row["rest"]["ms"]),
            source=f"{row['source']}, {row.get('date', '?')}, commit {row.get('commit', '?')}",
            device=str(row["device"]),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        raise refused(f"missing {error}" if isinstance(error, KeyError) else str(error)) from error
