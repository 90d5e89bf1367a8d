"""``radio-lit plan --calibrate FILE``: measure the device at hand for the time model
(:mod:`radio_lit.planning.time_model`) and write its calibration file.

Measured, each on real tensors of the device (CUDA if visible, else the CPU):

- **matrix products** over a grid of ``(M, N, K)`` in each dtype the device trains in
  (float32 on a CPU; bfloat16 and float16 on CUDA): achieved TFLOP/s;
- **attention** (``F.scaled_dot_product_attention``, forward and backward) over sequence
  lengths and the head dims radio-lit's models use (64, 72, 80, 128): achieved TFLOP/s;
- **memory bandwidth**: a large copy, bytes read plus written per second (``copy_gb_per_s``);
- **the other operations' bandwidth and the host's cost per operation**: real training steps
  (forward, backward, AdamW) of a small ViT at two batch sizes, timed, their operations
  counted (:class:`~radio_lit.planning.counting.StepCounter`); what the curves above do not
  explain is fitted as bytes at ``memory_gb_per_s`` plus ``op_us`` per operation;
- **collectives**: not measured by this version (the plan takes the link bandwidths of
  ``devices.yaml``); the file says so.

Timing [choice]: on CUDA wall time between synchronisations; on a CPU the process's CPU time
(``time.process_time``), which a busy shared machine disturbs least, so a plan made with the
file predicts a step's CPU time at the thread count it was measured with (``threads``).
``quick``: fewer and smaller shapes (a CPU in a few seconds, for tests).
"""

from __future__ import annotations

import datetime
import math
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

from radio_lit.planning.counting import StepCounter
from radio_lit.planning.time_model import TimeModel

__all__ = ["calibrate", "write_calibration"]

#: Head dims of the shipped teachers and students (64: ViT-B/L, 72: SigLIP-so400m, 80: ViT-H,
#: 128: DINOv3-7B, ViT-g).
HEAD_DIMS = (64, 72, 80, 128)


def _timer(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":

        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return now
    return time.process_time


def _seconds(run: Callable[[], Any], now: Callable[[], float], budget: float) -> float:
    """Seconds of one ``run`` (after one warm-up): the least of repeats within ``budget``."""
    run()
    best, spent = math.inf, 0.0
    while spent < budget or best == math.inf:
        start = now()
        run()
        took = now() - start
        best, spent = min(best, took), spent + took
        if took > budget:
            break
    return max(best, 1e-9)


def _gemms(device: torch.device, dtype: torch.dtype, quick: bool, now: Any) -> list[list[float]]:
    sides = [32, 256, 1024] if quick else [64, 256, 1024, 4096, 16384]
    if device.type == "cpu" and not quick:
        sides = [32, 128, 512, 2048]
    rows = []
    for m in sides:
        for n in sides[:3] if quick else sides:
            k = n
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            took = _seconds(lambda a=a, b=b: a @ b, now, 0.01 if quick else 0.05)
            rows.append([m, n, k, round(2 * m * n * k / took / 1e12, 6)])
    return rows


def _attention(
    device: torch.device, dtype: torch.dtype, quick: bool, now: Any
) -> list[list[float]]:
    lengths = [64, 256] if quick else [256, 1024, 4096, 16384]
    if device.type == "cpu" and not quick:
        lengths = [64, 256, 1024]
    rows = []
    for length in lengths:
        for dim in HEAD_DIMS:
            heads = max(1, 2**12 // length) if device.type == "cpu" else max(8, 2**22 // length)
            q, k, v = (
                torch.randn(1, heads, length, dim, device=device, dtype=dtype, requires_grad=True)
                for _ in range(3)
            )
            grad = torch.ones_like(q)
            forward = 4 * heads * length * length * dim  # torch.utils.flop_counter's sdpa
            backward = 10 * heads * length * length * dim  # its sdpa_backward_flop_count
            budget = 0.01 if quick else 0.05

            def forward_pass(q=q, k=k, v=v) -> torch.Tensor:  # noqa: ANN001
                return F.scaled_dot_product_attention(q, k, v)

            fwd = _seconds(forward_pass, now, budget)
            both = _seconds(lambda grad=grad: forward_pass().backward(grad), now, budget)
            back = max(both - fwd, 1e-9)
            rows.append([length, dim, 0, round(forward / fwd / 1e12, 6)])
            rows.append([length, dim, 1, round(backward / back / 1e12, 6)])
    return rows


def _bandwidth(device: torch.device, quick: bool, now: Any) -> float:
    values = (2**22 if quick else 2**26) if device.type == "cpu" else 2**28
    source = torch.randn(values, device=device)
    target = torch.empty_like(source)
    took = _seconds(lambda: target.copy_(source), now, 0.02 if quick else 0.1)
    return 2 * source.numel() * source.element_size() / took / 1e9


def _reference_steps(
    device: torch.device, curves: TimeModel, now: Any, quick: bool
) -> dict[str, Any]:
    """The other operations' bandwidth and the host's cost per operation, fitted on real
    training steps of a small ViT (timm's; its input resized with antialiasing as radio-lit's
    views are, a cosine loss, AdamW) at two batch sizes: the same operations on more data.
    Each step's time less what the curves explain is ``bytes / bandwidth + operations x
    op_us``; two batches give both [choice: the copy's bandwidth is far above what small,
    strided and reducing operations reach, most of all on a CPU]."""
    import timm

    torch.manual_seed(0)
    width = 64 if quick else 192
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=64,
        embed_dim=width,
        depth=2 if quick else 4,
        num_heads=width // 32,
        num_classes=0,
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = []
    for batch in (2, 16) if quick else (4, 64):
        images = torch.randn(batch, 3, 96, 96, device=device)
        target = torch.randn(batch, width, device=device)

        def step(images: torch.Tensor = images, target: torch.Tensor = target) -> None:
            views = F.interpolate(images, size=(64, 64), mode="bilinear", antialias=True)
            loss = 1 - F.cosine_similarity(model(views), target, dim=-1).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # AdamW's state made: every counted step dispatches the same operations
        counter = StepCounter()
        with counter:
            step()
        measured = _seconds(step, now, 0.1 if quick else 0.5)
        moved, calls = sum(counter.ops.moved.values()), sum(counter.ops.calls.values())
        bare = TimeModel(curves.device, curves.gemm, curves.attention, math.inf, 0.0, "fitting")
        left = measured - sum(bare.price(counter.ops).values()) / 1e3
        rows.append(
            {"batch": batch, "ms": measured * 1e3, "bytes": moved, "ops": calls, "left": left}
        )
    (small, large) = rows
    per_byte = max((large["left"] - small["left"]) / max(large["bytes"] - small["bytes"], 1), 0.0)
    per_op = max((small["left"] - small["bytes"] * per_byte) / small["ops"], 0.0)
    bandwidth = 1 / per_byte / 1e9 if per_byte > 0 else curves.memory_gb_per_s
    steps = [
        {"batch": r["batch"], "step_ms": round(r["ms"], 4), "operations": r["ops"]} for r in rows
    ]
    return {"op_us": round(per_op * 1e6, 4), "ops_gb_per_s": round(bandwidth, 4), "steps": steps}


def _commit() -> str:
    try:
        run = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except OSError:
        return "unknown"
    return run.stdout.strip() or "unknown"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def calibrate(device: str | None = None, quick: bool = False) -> dict[str, Any]:
    """The calibration file's content for ``device`` (default: CUDA if visible, else CPU)."""
    import radio_lit

    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    now = _timer(where)
    dtypes = [torch.float32] if where.type == "cpu" else [torch.bfloat16, torch.float16]
    started = time.perf_counter()
    with torch.no_grad():
        gemm = {str(d).removeprefix("torch."): _gemms(where, d, quick, now) for d in dtypes}
        bandwidth = _bandwidth(where, quick, now)
    attention = {str(d).removeprefix("torch."): _attention(where, d, quick, now) for d in dtypes}
    name = _device_name(where)
    curves = TimeModel(name, gemm, attention, bandwidth, 0.0, "being measured")
    reference = _reference_steps(where, curves, now, quick)
    visible = torch.cuda.device_count() if where.type == "cuda" else 1
    return {
        "device": name,
        "measured": {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _commit(),
            "versions": {
                "radio_lit": str(getattr(radio_lit, "__version__", "unknown")),
                "torch": str(torch.__version__),
                "cuda": str(torch.version.cuda),
                "python": platform.python_version(),
            },
            "how": "radio-lit plan --calibrate" + (" --quick" if quick else ""),
            "timer": "wall time, synchronised" if where.type == "cuda" else "process CPU time",
            "threads": torch.get_num_threads(),
            "seconds": round(time.perf_counter() - started, 1),
            "collectives": f"not measured ({visible} device(s) visible; this version measures "
            "none): the plan takes devices.yaml's link bandwidths",
        },
        "gemm": gemm,
        "attention": attention,
        "copy_gb_per_s": round(bandwidth, 3),
        "memory_gb_per_s": reference["ops_gb_per_s"],
        "op_us": reference["op_us"],
        "reference_steps": reference["steps"],
    }


def write_calibration(path: str | Path, device: str | None = None, quick: bool = False) -> dict:
    """Measure (:func:`calibrate`) and write the calibration file ``path`` (YAML)."""
    content = calibrate(device, quick)
    header = (
        "# radio-lit plan's time model on this device (radio_lit/planning/time_model.py):\n"
        "# gemm rows [M, N, K, TFLOP/s]; attention rows [sequence, head dim, backward, TFLOP/s]\n"
    )
    Path(path).write_text(header + yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return content
