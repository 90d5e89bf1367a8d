"""What a plan's figures rest on: the memory verdict with the share of the step peak the plan
has missed on GPUs, the step time's range from the measured errors, every assumption the plan
made with where it came from, and each figure's basis (``radio-lit plan``'s last lines).

**Memory**: on the three fixed-resolution GPU runs the plan was 11-13 % under the measured
peak, a deficit of 17-21 % of the counted *step peak* in each (1.7 GiB of 10.1, 2.2 of 10.1,
11.9 of 66.1; benchmarks/README.md, "plan"): something a CUDA step holds in proportion to its
activations. A rank's memory is therefore ``[total + 17 %, total + 21 %]`` of its step peak
(:data:`UNEXPLAINED_PEAK_SHARE`, until ``benchmarks/memory_at_peak.py`` finds it on a GPU):
"fits" when the upper end is within the GPU, "may not fit" when only the counted total is,
"DOES NOT FIT" when not even that is.

**Time**: the plan's step against measured GPU steps (:data:`TIME_CHECKS`, plan / measured):
the measured step lies within ``[plan / max, plan / min]`` of those ratios [choice: the
errors of one model family on one GPU family; the range of a config of other shapes is no
wider in the plan, though it may be in fact: its basis says "extrapolated"].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radio_lit.planning.time_model import TimeModel, measured_gpu

__all__ = [
    "TIME_CHECKS",
    "UNEXPLAINED_PEAK_SHARE",
    "assumption",
    "assumptions",
    "packed_assumption",
    "basis",
    "memory_verdict",
    "time_range",
]

#: The share of the counted step peak a GPU run held beyond the plan: least and most of the
#: three fixed-resolution runs (benchmarks/README.md, "plan": 17-21 %).
UNEXPLAINED_PEAK_SHARE = (0.17, 0.21)
#: The plan's step time over the measured one on GPUs (benchmarks/README.md, "plan").
TIME_CHECKS = {
    "configs/stage1.yaml, batch 32, H200, train_step.py (2026-11-28)": 0.88,
    "configs/stage1.yaml, batch 32, H100, profile_step.py (2026-11-26, the calibration run)": 1.00,
}


def memory_verdict(memory_gib: Mapping[str, float], gpu_gib: float) -> tuple[str, list[float]]:
    """``(verdict, [low, high] GiB)`` of a rank's memory by part (``"total"``, ``"step
    peak"``) on a GPU of ``gpu_gib`` (module docstring)."""
    total, peak = memory_gib["total"], memory_gib["step peak"]
    low, high = (total + share * peak for share in UNEXPLAINED_PEAK_SHARE)
    if total > gpu_gib:
        return "DOES NOT FIT", [low, high]
    return ("fits" if high <= gpu_gib else "may not fit"), [low, high]


def time_range(ms: float) -> list[float]:
    """``[low, high]`` of a measured step the plan puts at ``ms`` (module docstring)."""
    ratios = TIME_CHECKS.values()
    return [ms / max(ratios), ms / min(ratios)]


def _given(section: Mapping[str, Any], key: str) -> str:
    value = section[key]
    if isinstance(value, str) and value.startswith("--trainer."):
        return f"--trainer.{key} on the command line"
    return f"the config's trainer.{key}"


def assumption(name: str, value: Any, source: str) -> dict[str, str]:
    """One assumption of a plan: what, its value, where it came from."""
    return {"name": name, "value": str(value), "source": source}


def packed_assumption(packing: Any, kernel: str) -> dict[str, str]:
    """The packed student forward's attention kernel the plan counted
    (:func:`~radio_lit.planning.counting.packed_attention`) and why that one."""
    if packing.kernel is not None:
        source = "model.student_packing.init_args.kernel"
    elif packing.measured:
        source = "the fastest of model.student_packing.init_args.measured at the head dim"
    else:
        source = (
            "a GPU's default without a measured table [choice]; measure the kernels: "
            "python benchmarks/packing.py --device cuda"
        )
    return assumption("packed student attention", kernel, source)


def assumptions(
    raw: Mapping[str, Any],
    trainer: Any,
    strategy: str,
    gpus: int,
    gpus_given: bool,
    cache_images: int,
    cache_images_given: bool,
    calibration: Any,
    gpu_key: str,
    overrides: Sequence[str] = (),
) -> list[dict[str, str]]:
    """What the plan of a config assumed, each with its source: the config's key, the
    command's option (``overrides``: ``--trainer.KEY`` given on the command line), or a
    default (Lightning's or radio-lit plan's)."""
    section = dict(raw.get("trainer") or {})
    for option in overrides:
        key = option.removeprefix("--trainer.").split("=", 1)[0]
        if option.startswith("--trainer."):
            section[key] = option
    out = [
        assumption(
            "GPUs",
            gpus,
            "--gpus" if gpus_given else "the config's trainer.devices x trainer.num_nodes",
        )
    ]
    if "strategy" in section:
        where = _given(section, "strategy")
    elif gpus > 1:
        where = "Lightning's default for several devices: the config names no trainer.strategy"
    else:
        where = "the config names no trainer.strategy; one GPU"
    out.append(assumption("strategy", strategy, where))
    precision = str(trainer.precision)
    out.append(
        assumption(
            "precision",
            precision,
            _given(section, "precision")
            if "precision" in section
            else "Lightning's default: the config names no trainer.precision",
        )
    )
    steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
    out.append(
        assumption(
            "steps",
            "none" if steps is None else f"{steps:,}",
            _given(section, "max_steps")
            if steps is not None
            else "no trainer.max_steps in the config: no GPU-hours",
        )
    )
    out.append(
        assumption(
            "images in the cache",
            f"{cache_images:,}",
            "--cache-images"
            if cache_images_given
            else "ImageNet-1k's training images, --cache-images's default",
        )
    )
    device = getattr(calibration, "device", "") or "?"
    out.append(
        assumption(
            "calibration", calibration.source, f"measured on {device}, {_on(calibration, gpu_key)}"
        )
    )
    return out


def _measured_on(calibration: Any, gpu_key: str) -> bool:
    """Whether ``calibration`` was measured on the planned GPU (its device named by the GPU's
    key in ``devices.yaml`` as a word: ``h100`` in ``NVIDIA H100 80GB HBM3``)."""
    return measured_gpu(getattr(calibration, "device", "") or "") == gpu_key.lower()


def _on(calibration: Any, gpu_key: str) -> str:
    """How a calibration's figures reach the planned GPU: measured there, extrapolated by the
    GPUs' peaks (a per-phase calibration, or a file of another GPU of ``devices.yaml``:
    :meth:`~radio_lit.planning.time_model.TimeModel.on`), or priced at a device's measured
    rates as they are (a file of a device the table lacks: it is not scaled)."""
    if _measured_on(calibration, gpu_key):
        return "the planned GPU"
    if isinstance(calibration, TimeModel) and not calibration.scaled_to:
        return f"not the planned {gpu_key}: its measured rates priced as they are, not scaled"
    return f"extrapolated to {gpu_key} by the two GPUs' peaks"


def basis(device_name: str, calibration: Any, gpu_key: str) -> dict[str, str]:
    """Each figure of a plan and what it rests on."""
    device = getattr(calibration, "device", "") or "?"
    where = calibration.basis
    if not _measured_on(calibration, gpu_key):
        where += (
            f"; not scaled to {device_name} (a step of the calibrated device)"
            if isinstance(calibration, TimeModel) and not calibration.scaled_to
            else f"; extrapolated to {device_name} by its peaks"
        )
    checks = ", ".join(f"{r:.2f}x" for r in TIME_CHECKS.values())
    low, high = UNEXPLAINED_PEAK_SHARE
    return {
        "memory": "counted on fake tensors (this machine), plus "
        f"{low:.0%}-{high:.0%} of the step peak the plan missed on GPU runs",
        "FLOPs": "counted on fake tensors (PyTorch's FLOP formulas)",
        "step time": f"{where}; range from the plan/measured steps on GPUs ({checks})",
        "communication": f"gloo's collectives measured on {device} ({calibration.source})"
        if getattr(calibration, "collectives", None)
        else "bandwidths and latencies of devices.yaml (datasheets, NCCL's tuning model), "
        "not measured",
        "cache": "counted bytes; read at devices.yaml's cache_read_gb_per_s per node, not measured",
    }
