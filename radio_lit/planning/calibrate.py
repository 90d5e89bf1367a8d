"""``radio-lit plan --calibrate FILE``: measure the device at hand for the time model
(:mod:`radio_lit.planning.time_model`) and write its calibration file.

Measured, each on real tensors of the device (CUDA if visible, else the CPU):

- **matrix products** over a grid of ``(M, N, K)`` in each dtype the device trains in
  (float32 on a CPU; bfloat16 and float16 on CUDA): achieved TFLOP/s;
- **attention** (``F.scaled_dot_product_attention``, forward and backward) over sequence
  lengths and the head dims radio-lit's models use (64, 72, 80, 128): achieved TFLOP/s;
- **memory bandwidth**: a large copy, bytes read plus written per second (``copy_gb_per_s``);
- **the optimizer**: a fused AdamW step over a few million parameters, its 28 bytes a
  parameter per second (``optimizer_gb_per_s``: :func:`_optimizer_rate`);
- **the other operations' bandwidth and the host's cost per operation**: real Lightning
  training steps of a tiny distillation (one teacher, a CPE ViT student) at three batch
  sizes, timed, their operations counted as ``radio-lit plan`` counts them
  (:func:`_reference_steps`); what the curves above do not explain is fitted as bytes at
  ``memory_gb_per_s`` plus ``op_us`` per operation (Python, dispatch, the loop's hooks);
- **collectives**: on a CPU, gloo's all-reduce, all-gather and reduce-scatter between two
  processes, each a bandwidth and a latency (:func:`_collectives`), and FSDP2's host cost
  per sharded tensor and step there (``fsdp2_us_per_tensor``: :func:`_fsdp2_host_seconds`);
  on CUDA not measured by this version (the plan takes the link bandwidths of
  ``devices.yaml``, and FSDP2's host work as overlapped with the GPU's; the file says so).

Timing [choice]: on CUDA wall time between synchronisations; on a CPU the process's CPU time
(``time.process_time``), which a busy shared machine disturbs least, so a plan made with the
file predicts a step's CPU time at the thread count it was measured with (``threads``).
``quick``: fewer and smaller shapes (a CPU in a few seconds, for tests).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import io
import itertools
import math
import platform
import queue as queue_module
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

from radio_lit.planning.devices import OPTIMIZER_BYTES_PER_PARAMETER
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


#: Float32 parameters of :func:`_optimizer_rate`'s step, in 16 tensors (on a CPU 112 MiB of
#: its 28 bytes a parameter: beyond the caches, as a model's optimizer state is).
OPTIMIZER_PARAMETERS = {"cpu": 2**22, "cuda": 2**26}


def _optimizer_rate(device: torch.device, now: Any) -> float:
    """A fused AdamW step's rate in GB/s of the
    :data:`~radio_lit.planning.devices.OPTIMIZER_BYTES_PER_PARAMETER` it moves per parameter
    [choice: AdamW ``fused`` stands for every optimizer; it updates in place, which a copy
    into another buffer does not: on this project's CPU a copy of the same bytes ran at
    13 GB/s, the step at 23-26]."""
    values = OPTIMIZER_PARAMETERS[device.type]
    parameters = [torch.nn.Parameter(torch.randn(values // 16, device=device)) for _ in range(16)]
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter)
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, fused=True)
    took = _seconds(optimizer.step, now, 0.1)
    return values * OPTIMIZER_BYTES_PER_PARAMETER / took / 1e9


#: The reference run's batches per step, repeated (the first round a warm-up) [choice: a
#: 16x range of bytes moved at the same operations, so the two costs separate].
REFERENCE_BATCHES = (2, 8, 32)


def _reference_module() -> Any:
    """The reference run's distillation: a tiny DINOv2 teacher (timm, random weights) and a
    tiny CPE ViT student at 64 px, radio-lit's defaults otherwise (MSE and cosine losses,
    AdamW)."""
    from radio_lit.module import DistillationModule
    from radio_lit.students import CPEViT
    from radio_lit.teachers.dinov2 import DINOv2Teacher

    torch.manual_seed(0)
    student = CPEViT(
        model="vit_tiny_patch16_224",
        max_resolution=256,
        model_kwargs={"depth": 2, "embed_dim": 64, "num_heads": 2},
    )
    teacher = DINOv2Teacher(
        "vit_small_patch14_reg4_dinov2",
        pretrained=False,
        model_kwargs={"depth": 2, "embed_dim": 48, "num_heads": 2, "img_size": 56},
    )
    return DistillationModule(student=student, teachers={"dino": teacher}, student_resolution=64)


def _fit_steps(device: torch.device, now: Any, rounds: int) -> dict[int, float]:
    """Median seconds of a real ``Trainer.fit`` step of :func:`_reference_module` at each of
    :data:`REFERENCE_BATCHES` (96 px uint8 crops; forward, backward, optimizer step and the
    loop's hooks, as a run's step: the data loading outside)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    order = list(REFERENCE_BATCHES) * (rounds + 1)
    images = torch.randint(0, 256, (sum(order), 3, 96, 96), dtype=torch.uint8)
    starts = list(itertools.accumulate(order, initial=0))
    batches = [list(range(a, a + n)) for a, n in zip(starts, order, strict=False)]
    times: dict[int, list[float]] = {b: [] for b in REFERENCE_BATCHES}

    class Timed(pl.Callback):
        def on_train_batch_start(self, *_: Any) -> None:
            self.start = now()

        def on_train_batch_end(self, trainer: Any, _: Any, __: Any, batch: Any, ___: Any) -> None:
            if trainer.global_step > len(REFERENCE_BATCHES):  # the first round: a warm-up
                times[batch.shape[0]].append(now() - self.start)

    trainer = pl.Trainer(
        accelerator="cpu" if device.type == "cpu" else "gpu",
        devices=[device.index or 0] if device.type == "cuda" else 1,
        max_steps=len(order),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[Timed()],
    )
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_reference_module(), DataLoader(images, batch_sampler=batches))
    return {b: statistics.median(t) for b, t in times.items()}


def _reference_steps(
    device: torch.device, curves: TimeModel, now: Any, quick: bool
) -> dict[str, Any]:
    """The other operations' bandwidth and the host's cost per operation, fitted on a real
    ``radio-lit fit`` step: a tiny distillation (:func:`_reference_module`) run by Lightning
    at three batch sizes, timed, and counted as ``radio-lit plan`` counts a step
    (:func:`~radio_lit.planning.counting.count_step` on fake tensors). Each step's time less
    what the curves price (matrix products, attention; the optimizer's bytes at its measured
    rate) is ``bytes / bandwidth + operations x op_us``, least squares over the three
    [choice: the loop's hooks, the losses, the normalizers and Python between operations are
    part of the host's cost per operation; a small ViT's bare step leaves them out, and a
    real step on a CPU spends most of its time there]."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from radio_lit.planning.counting import count_step, fake_module

    measured = _fit_steps(device, now, 3 if quick else 8)
    module, mode = _reference_module(), FakeTensorMode(allow_non_fake_inputs=True)
    fake_module(module, mode)
    parameters = sum(p.numel() for _, p in module.trainable_parameters())
    bare = TimeModel(curves.device, curves.gemm, curves.attention, math.inf, 0.0, "fitting")
    optimizer = parameters * OPTIMIZER_BYTES_PER_PARAMETER / (curves.optimizer_gb_per_s * 1e9)
    rows = []
    for batch, seconds in measured.items():
        with warnings.catch_warnings():  # its self.log outside a Trainer: nothing to log
            warnings.simplefilter("ignore")
            count = count_step(module, mode, 96, batch, None)
        moved = sum(count.ops.moved.values())
        left = seconds - sum(bare.price(count.ops).values()) / 1e3 - optimizer
        rows.append(
            {
                "batch": batch,
                "s": seconds,
                "bytes": moved,
                "ops": sum(count.ops.calls.values()),
                "left": left,
            }
        )
    per_op, per_byte = _least_squares(
        [(r["ops"], r["bytes"]) for r in rows], [r["left"] for r in rows]
    )
    bandwidth = 1 / per_byte / 1e9 if per_byte > 0 else curves.memory_gb_per_s
    steps = [
        {
            "batch": r["batch"],
            "step_ms": round(r["s"] * 1e3, 4),
            "operations": r["ops"],
            "bytes": r["bytes"],
        }
        for r in rows
    ]
    return {"op_us": round(per_op * 1e6, 4), "ops_gb_per_s": round(bandwidth, 4), "steps": steps}


def _least_squares(x: list[tuple[float, float]], y: list[float]) -> tuple[float, float]:
    """``(a, b)`` >= 0 minimising ``sum (a x0 + b x1 - y)^2`` (one of them 0 when the free
    solution has a negative one: the other fitted alone)."""
    solution = (
        torch.linalg.lstsq(
            torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)[:, None]
        )
        .solution[:, 0]
        .tolist()
    )
    if min(solution) >= 0:
        return solution[0], solution[1]
    alone = [
        max(sum(r[i] * v for r, v in zip(x, y, strict=True)) / sum(r[i] ** 2 for r in x), 0.0)
        for i in (0, 1)
    ]
    return (alone[0], 0.0) if solution[1] < 0 else (0.0, alone[1])


#: Values of float32 per rank of the measured collectives: one (the latency), a small and a
#: large message (the bandwidth between them).
COLLECTIVE_SIZES = (1, 2**14, 2**21)
#: Runs of each collective at each size; their median is taken (a step's collectives are not
#: its fastest: the least of six was 1.4-1.5x under the median on this project's CPU).
COLLECTIVE_RUNS = 9
#: Seconds to wait for the two gloo ranks before the collectives are left unmeasured.
COLLECTIVE_TIMEOUT_S = 300


def _collective_rank(rank: int, store: str, sizes: tuple[int, ...], out: Any) -> None:
    """One of the two gloo ranks of :func:`_collectives`: each collective at each size, the
    median of :data:`COLLECTIVE_RUNS` runs (process CPU time, the communication threads
    included), the runs of every collective and size interleaved [choice: a disturbance of
    the shared machine lasting a second lands in a few runs of each, not in all runs of one:
    one calibration of nine back to back read the all-gather's bandwidth 0.15 GB/s against
    0.62-1.09 in the others]; rank 0 puts ``{op: [[bytes sent, seconds], ...]}`` on ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    # torch >= 2.14 renames them all_gather_single, reduce_scatter_single (FSDP2 calls these)
    warnings.filterwarnings("ignore", ".*_tensor` is deprecated", FutureWarning)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    runs = []  # (op, bytes sent per rank, run)
    for n in sizes:
        even = 2 * math.ceil(n / 2)  # a reduce-scatter's input splits in two
        x, gathered, half = torch.randn(even), torch.empty(2 * even), torch.empty(even // 2)
        runs += [  # bytes sent per rank on a ring of 2: (N - 1) / N of the data, x2 all-reduce
            ("all-reduce", 4 * n, functools.partial(dist.all_reduce, x[:n])),
            ("all-gather", 4 * even, functools.partial(dist.all_gather_into_tensor, gathered, x)),
            ("reduce-scatter", 2 * even, functools.partial(dist.reduce_scatter_tensor, half, x)),
        ]
    seconds = _interleaved_medians([run for _, _, run in runs], dist.barrier)
    rows: dict[str, list[list[float]]] = {}
    for (op, sent, _), took in zip(runs, seconds, strict=True):
        rows.setdefault(op, []).append([sent, took])
    fsdp2 = _fsdp2_host_seconds(dist.barrier)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put({"collectives": rows, "fsdp2": fsdp2})


def _interleaved_medians(
    runs: list[Callable[[], Any]], barrier: Callable[[], Any], rounds: int = COLLECTIVE_RUNS
) -> list[float]:
    """Each of ``runs``' median process CPU time over ``rounds`` rounds, a round running
    each once in turn, each run after ``barrier``."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for run, took in zip(runs, times, strict=True):
            barrier()
            start = time.process_time()
            run()
            took.append(time.process_time() - start)
    return [statistics.median(took) for took in times]


#: Linear layers of :func:`_fsdp2_host_seconds`' module (two tensors each), their width, and
#: the steps timed (two calibrations of this project's CPU at 32 layers and 9 steps: 55 and 93
#: us a tensor).
FSDP2_LAYERS, FSDP2_WIDTH, FSDP2_RUNS = 64, 16, 25


def _fsdp2_host_seconds(barrier: Callable[[], Any]) -> list[float]:
    """FSDP2's host cost on this process group: ``[tensors, seconds with FSDP2, seconds
    without]``, a training step (forward, backward, optimizer step) of a module of
    :data:`FSDP2_LAYERS` small linear layers, one FSDP2 unit over the group (its ``DTensor``
    shards, AdamW ``foreach``), and of the same module unsharded (AdamW ``fused``), each the
    median of :data:`FSDP2_RUNS` steps after three. The tensors are small: the difference
    is FSDP2's work per tensor (its hooks, copy-in and copy-out, the gradients made
    ``DTensor``, the optimizer's ``DTensor`` dispatch) and one all-gather's and one
    reduce-scatter's latency. The two modules' steps interleaved, as the collectives'."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    layers = [torch.nn.Linear(FSDP2_WIDTH, FSDP2_WIDTH) for _ in range(FSDP2_LAYERS)]
    plain = torch.nn.Sequential(*layers)
    sharded = fully_shard(copy.deepcopy(plain), mesh=init_device_mesh("cpu", (2,)))
    x = torch.randn(8, FSDP2_WIDTH)
    steps = []
    for module, kind in ((sharded, "foreach"), (plain, "fused")):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, **{kind: True})

        def step(module: torch.nn.Module = module, optimizer: Any = optimizer) -> None:
            module(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        for _ in range(3):
            step()
        steps.append(step)
    return [2 * FSDP2_LAYERS, *_interleaved_medians(steps, barrier, FSDP2_RUNS)]


def _collectives() -> tuple[dict[str, list[float]], float]:
    """Gloo's collectives between two processes of this CPU (``torch.multiprocessing``,
    spawned): per operation ``[GB/s of the bytes a rank sends, latency in ms]``: the
    latency a one-value message's time, the bandwidth the slope between a small and a large
    message (:data:`COLLECTIVE_SIZES`); and FSDP2's host microseconds per sharded tensor and
    step beyond its collectives (:func:`_fsdp2_host_seconds`, less the all-gather's and the
    reduce-scatter's latency). Empty and 0 when the two ranks did not report within
    :data:`COLLECTIVE_TIMEOUT_S`."""
    import tempfile

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        ranks = [
            context.Process(target=_collective_rank, args=(r, store, COLLECTIVE_SIZES, queue))
            for r in (0, 1)
        ]
        for process in ranks:
            process.start()
        try:
            rows = queue.get(timeout=COLLECTIVE_TIMEOUT_S)
        except queue_module.Empty:  # a rank failed (no gloo) or hung: not measured
            rows = {}
        for process in ranks:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
    if not rows:
        return {}, 0.0
    out = {}
    for op, ((_, t_one), (small, t_small), (large, t_large)) in rows["collectives"].items():
        per_byte = max((t_large - t_small) / (large - small), 1e-15)
        out[op] = [round(1 / per_byte / 1e9, 4), round(t_one * 1e3, 5)]
    tensors, with_fsdp2, without = rows["fsdp2"]
    latencies = (out["all-gather"][1] + out["reduce-scatter"][1]) / 1e3
    per_tensor = max(with_fsdp2 - without - latencies, 0.0) / tensors
    return out, round(per_tensor * 1e6, 2)


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
    optimizer = _optimizer_rate(where, now)
    curves = TimeModel(
        name,
        gemm,
        attention,
        bandwidth,
        0.0,
        "being measured",
        copy_gb_per_s=bandwidth,
        optimizer_gb_per_s=optimizer,
    )
    reference = _reference_steps(where, curves, now, quick)
    visible = torch.cuda.device_count() if where.type == "cuda" else 1
    measured_collectives, fsdp2_us = _collectives() if where.type == "cpu" else ({}, 0.0)
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
            "collectives": "gloo between two processes of this CPU"
            if measured_collectives
            else f"not measured ({visible} device(s) visible; this version measures gloo's "
            "on a CPU only): the plan takes devices.yaml's link bandwidths",
        },
        "gemm": gemm,
        "attention": attention,
        "copy_gb_per_s": round(bandwidth, 3),
        "optimizer_gb_per_s": round(optimizer, 3),
        "memory_gb_per_s": reference["ops_gb_per_s"],
        "op_us": reference["op_us"],
        "reference_steps": reference["steps"],
        "collectives": measured_collectives,
        "fsdp2_us_per_tensor": fsdp2_us,
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
