"""Where every millisecond of a training step goes: one command, any config, CPU or GPU.

Builds the config (and ``--model... --trainer... --data...`` overrides) with radio-lit's own
``RadioLitCLI``, at its real sizes with random weights (``benchmarks/harness.py``: pretrained
tags and checkpoints are dropped; ``--teacher-depth K`` keeps every teacher's width and shortens
it to K blocks, stated in the output), labels the step's phases (``benchmarks/phases.py``),
trains it with the config's own Trainer and callbacks for ``--warmup`` steps,
then ``--steps`` timed steps, one profiled step, one step whose scalar reads are followed and
one FLOP-counted step, and prints per phase
(views, each teacher, student forward, each head, grid matching, normalizers, losses, backward,
optimizer, guard, data wait, and "Lightning + logging" for the rest of the step):

* time: median over the timed steps, every phase boundary device-synchronised (on CUDA);
* aten operations dispatched (top-level: not nested in another aten operation) and, on CUDA,
  kernel launches, from the profiled step (no synchronisation added there);
* FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on the real modules during
  the FLOP step (forward and backward), achieved TFLOP/s and the share of the device's peak
  (a table of known GPUs' dense bf16 peaks; on a CPU, a measured float32 matmul peak);

and for the step: peak memory, its scalar reads (``.item()`` and the like) split into those
that synchronise with a GPU, with where each is made, and those of host state (the data
loader's, the optimizer's step counts: ``benchmarks/dispatch.py``, ``ScalarReads``), on CUDA
the runtime's synchronising calls, the operation counts of a plain timm model of the
student's architecture (the floor: forward and backward of the same batch), the top operations
by time and a chrome trace (``--trace``).

    python benchmarks/profile_step.py                          # the quickstart on CPU, ~1 min
    python benchmarks/profile_step.py --config configs/stage1.yaml --teacher-depth 2 \\
        --trainer.accelerator=cpu --trainer.devices=1 --trainer.strategy=auto \\
        --trainer.precision=32-true --data=radio_lit.data.ImageFolderDataModule \\
        --data.train_dir=radio_lit:sample_images --data.crop_size=384 --data.batch_size=2
    python benchmarks/profile_step.py --config configs/stage1.yaml --device cuda ...  # a GPU

Operation counts do not depend on the machine's load; CPU times do (say so when quoting them).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from benchmarks.dispatch import ScalarReads, count_events  # noqa: E402
from benchmarks.phases import (  # noqa: E402
    OTHER,
    Driver,
    PhaseClock,
    attribute,
    instrument,
    uninstrument,
)

#: Dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets, by device-name part.
GPU_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 80GB HBM3": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10": 125.0,
    "L4": 121.0,
}
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
SCALAR_READS = ("aten::_local_scalar_dense",)


def _launches(events: list[Any]) -> int:
    return sum(1 for e in events if "LaunchKernel" in e.name)


def _syncs(events: list[Any]) -> int:
    return sum(1 for e in events if e.name in SCALAR_READS or e.name in SYNC_CALLS)


def device_peak(device: Any) -> tuple[float, str]:
    """Peak TFLOP/s of ``device``: a known GPU's dense bf16 figure, else a measured matmul."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAK_TFLOPS.items():
            if key in name:
                return peak, f"{name}, dense bf16 data-sheet peak"
        dtype, label = torch.bfloat16, f"{name}, measured bf16 matmul"
    else:
        dtype, label = torch.float32, "CPU, measured float32 matmul"
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ a
    sync = harness.synchronizer(device)
    sync()
    start, repeats = time.perf_counter(), 3 if device.type == "cpu" else 20
    for _ in range(repeats):
        a @ a
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12, label


def floor_counts(cli: Any, batch: int, device: Any) -> tuple[Any, ...] | None:
    """Operations (and CUDA launches) of a plain timm model of the student's architecture:
    forward and backward on the student's batch, or None for a non-timm student."""
    import timm
    import torch

    init = cli.config.model.student.init_args
    if cli.config.model.student.class_path.rsplit(".", 1)[-1] != "CPEViT":
        return None
    size = cli.model.student_resolution
    plain = timm.create_model(
        init.model, pretrained=False, num_classes=0, img_size=size, **(init.model_kwargs or {})
    ).to(device)
    images = torch.randn(batch, 3, *size, device=device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    plain(images).sum().backward()  # warm-up
    with torch.profiler.profile(activities=activities) as forward:
        out = plain(images)
    loss = out.float().sum()
    with torch.profiler.profile(activities=activities) as backward:
        loss.backward()
    f, b = list(forward.events()), list(backward.events())
    return count_events(f), _launches(f), count_events(b), _launches(b)


def vit_forward_flops(model: str, size: tuple[int, int], **kwargs: Any) -> tuple[float, float]:
    """One image's forward FLOPs of a plain timm ViT, counted by ``FlopCounterMode`` (on the
    meta device: shapes only), and the estimate ``2 * params * tokens + attention`` with
    attention ``4 * tokens^2 * width`` per block (QK^T and AV). Position embeddings and tokens
    are not matmul weights and are left out of ``params``."""
    import timm
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        vit = timm.create_model(model, pretrained=False, num_classes=0, img_size=size, **kwargs)
        images = torch.empty(1, 3, *size)
    with FlopCounterMode(display=False) as counter:
        vit(images)
    skip = ("pos_embed", "cls_token", "reg_token")
    params = sum(p.numel() for n, p in vit.named_parameters() if not n.startswith(skip))
    tokens = vit.patch_embed.num_patches + vit.num_prefix_tokens
    attention = 4 * tokens**2 * vit.embed_dim * len(vit.blocks)
    return float(counter.get_total_flops()), float(2 * params * tokens + attention)


def scalar_reads_report(reads: ScalarReads, cuda: bool) -> str:
    """The profiled step's scalar reads: those of device tensors (host-device
    synchronisations on a GPU) and those of host tensors, each by where it is made."""
    device = Counter(read.where for read in reads.reads if read.on_device)
    host = Counter(read.where for read in reads.reads if not read.on_device)
    basis = "" if cuda else " on a GPU (device tensors followed by provenance on this CPU)"
    lines = [
        f"scalar reads per step (.item() and the like): {len(reads.reads)}",
        f"  of device tensors, host-device synchronisations{basis}: {sum(device.values())}",
        *(f"    {count} at {where}" for where, count in device.most_common()),
        f"  of host tensors, no synchronisation: {sum(host.values())}",
        *(f"    {count} at {where}" for where, count in host.most_common(8)),
    ]
    return "\n".join(lines)


def _row(cells: list[Any], widths: list[int]) -> str:
    return "  ".join(
        str(c).rjust(w) if i else str(c).ljust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def report(args: argparse.Namespace, cli: Any, driver: Driver, notes: list[str]) -> None:
    import torch

    device = driver.device
    events = list(driver.profile.events())
    by_phase = attribute(events)
    peak, peak_label = device_peak(device)
    phases = sorted({*by_phase, *driver.phase_times[0], *driver.step_flops} - {"total"})
    median = {p: statistics.median(t.get(p, 0.0) for t in driver.phase_times) for p in phases}
    step_time = statistics.median(driver.step_times)
    median[OTHER] = max(0.0, step_time - sum(v for k, v in median.items() if k != OTHER))
    cuda = device.type == "cuda"
    header = ["phase", "ms", "aten top", "aten all"] + (["launches"] if cuda else [])
    header += ["syncs", "GFLOP", "TFLOP/s", "% peak"]
    widths = [22, 9, 9, 9] + ([9] if cuda else []) + [6, 10, 8, 7]
    print("\n" + _row(header, widths))
    totals: Counter[str] = Counter()
    for phase in sorted(phases, key=lambda p: -median.get(p, 0.0)):
        count = count_events(by_phase.get(phase, []))
        flops = driver.step_flops.get(phase, 0.0)
        seconds = median.get(phase, 0.0)
        rate = flops / seconds / 1e12 if seconds > 0 else 0.0
        cells = [phase, f"{seconds * 1e3:.1f}", count.top_level, count.total]
        cells += [_launches(by_phase.get(phase, []))] if cuda else []
        cells += [
            _syncs(by_phase.get(phase, [])),
            f"{flops / 1e9:.2f}",
            f"{rate:.3f}",
            f"{100 * rate / peak:.1f}",
        ]
        print(_row(cells, widths))
        totals.update(top=count.top_level, all=count.total)
    flops = driver.step_flops.get("total", 0.0)
    rate = flops / step_time / 1e12
    cells = ["step", f"{step_time * 1e3:.1f}", totals["top"], totals["all"]]
    cells += [_launches(events)] if cuda else []
    cells += [_syncs(events), f"{flops / 1e9:.2f}", f"{rate:.3f}", f"{100 * rate / peak:.1f}"]
    print(_row(cells, widths))
    batch = driver.batch_shape[0] if driver.batch_shape else 0
    steps = len(driver.step_times)
    print(f"\nimages/s: {batch / step_time:.2f} (batch {batch}, median of {steps} steps)")
    print(f"peak: {peak:.2f} TFLOP/s ({peak_label})")
    if cuda:
        memory = torch.cuda.max_memory_allocated(device) / 2**30
        print(f"peak memory: {memory:.2f} GiB allocated on the device")
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"peak memory: {memory:.2f} GiB resident (the process's peak)")
    syncs = sum(1 for e in events if e.name in SYNC_CALLS)
    print(scalar_reads_report(driver.scalar_reads, cuda))
    if cuda:
        print(f"synchronising CUDA runtime calls per step: {syncs}")
    floor = floor_counts(cli, batch, device)  # the step's images (one partition)
    if floor is None:
        print("floor: n/a (the student is not a timm ViT)")
    else:
        forward = count_events(by_phase.get("student forward", []))
        backward = count_events(by_phase.get("backward", []))
        f, f_launch, b, b_launch = floor
        init = cli.config.model.student.init_args
        line = (
            f"floor (plain timm {cli.config.model.student.init_args.model}, same batch): "
            f"forward {f}, backward {b}"
        )
        if cuda:
            line += f"; launches forward {f_launch}, backward {b_launch}"
        print(line)
        counted, estimate = vit_forward_flops(
            init.model, cli.model.student_resolution, **(init.model_kwargs or {})
        )
        print(
            f"floor forward FLOPs per image: {counted / 1e9:.2f} G counted, "
            f"{estimate / 1e9:.2f} G by 2 * params * tokens + attention ({counted / estimate:.3f}x)"
        )
        print(
            f"student forward / floor: {forward.top_level / f.top_level:.2f}x top-level; "
            f"the step's backward (student, heads, losses) / floor backward: "
            f"{backward.top_level / b.top_level:.2f}x"
        )
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\ntop {args.top} operations by {sort}:")
    print(driver.profile.key_averages().table(sort_by=sort, row_limit=args.top))
    if args.trace:
        driver.profile.export_chrome_trace(args.trace)
        print(f"chrome trace: {args.trace}")
    for note in notes:
        print(f"note: {note}")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = harness.step_arguments(__doc__, "timed steps (median; default 3)")
    parser.add_argument(
        "--pretrained",
        action="store_true",
        help="keep the config's pretrained weights (default: random weights, nothing loaded)",
    )
    parser.add_argument("--trace", default=None, help="chrome trace of the profiled step (.json)")
    parser.add_argument("--top", type=int, default=12, help="top operations by time to print")
    args, overrides = parser.parse_known_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    return args, overrides


def main(argv: list[str] | None = None) -> None:
    import torch

    args, overrides = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    harness.return_freed_memory()
    cli = harness.build(
        args.config,
        overrides,
        # + the profiled step, the scalar-read step, a gap, the FLOP step (Driver.schedule)
        max_steps=args.warmup + args.steps + 4,
        device=args.device,
        pretrained=args.pretrained,
        teacher_depth=args.teacher_depth,
    )
    harness.quiet()
    device = torch.device(args.device)
    clock = PhaseClock(harness.synchronizer(device))
    instrument(cli, clock)
    driver = Driver(args, clock, device)
    cli.trainer.callbacks.append(driver.callback())
    driver.time_data(cli.datamodule)
    notes = [] if args.pretrained else ["random weights (nothing loaded)"]
    if args.teacher_depth is not None:
        notes.append(f"teachers shortened to {args.teacher_depth} blocks, widths kept")
    notes.append(
        f"CPU times on this machine ({torch.get_num_threads()} threads) move with its load; "
        "operation counts do not"
        if device.type == "cpu"
        else "times device-synchronised at every phase boundary"
    )
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        uninstrument()
    report(args, cli, driver, notes)


if __name__ == "__main__":
    main()
