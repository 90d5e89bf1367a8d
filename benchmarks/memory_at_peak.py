"""What a real training run holds at its memory peak, by where it was allocated: the list
``radio-lit plan``'s count is checked against when the two disagree (benchmarks/README.md,
"plan": on GPUs the plan has been 11-13 % under).

    python benchmarks/memory_at_peak.py --config recipes/am-radio/stage2.yaml   # a lent GPU
    python benchmarks/memory_at_peak.py --config stage1.yaml --device cpu       # anywhere

The config is built and trained for ``--steps`` steps as ``gpu_check.py`` builds it (one
device; ``--device cuda``: real widths, teachers of ``--teacher-depth`` blocks; ``cpu``: CPU
sizes). Then the blocks alive at the run's largest allocated total, grouped and largest first:

- ``cuda``: CUDA's allocator history (``torch.cuda.memory._record_memory_history``), replayed
  to its peak; a block is grouped by the innermost frame of its allocation's Python stack in
  radio-lit, timm, open_clip, transformers, segment-anything or ``torch.nn`` (file:function);
- ``cpu`` (the proxy with no GPU): every storage an operation of the run creates, while it
  lives (:class:`~radio_lit.planning.counting.StepCounter`'s rule, on the real tensors),
  grouped by the training phase it was made in (``s<step>:forward|backward|optimizer``, from
  Lightning's hooks) and the operation that made it.
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_check  # noqa: E402

MIB = 2**20
#: Where a CUDA block is attributed: the innermost frame of its stack in one of these.
OWN_CODE = ("radio_lit/", "timm/", "open_clip/", "transformers/", "segment_anything/", "torch/nn/")


def phase_recorder() -> tuple[Any, Any]:
    """``(counter, callback)``: a :class:`StepCounter` that remembers, for every storage it
    counts, the phase and operation that made it, and the live set at its peak; and the
    Lightning callback that names the phases."""
    from lightning.pytorch import Callback

    from radio_lit.planning.counting import StepCounter

    class PhaseCounter(StepCounter):
        def __init__(self) -> None:
            super().__init__()
            self.phase, self.operation = "setup", "input"
            self.made: dict[int, tuple[str, str, int]] = {}
            self.at_peak: list[tuple[str, str, int]] = []
            self._snapshot_at = 0

        def track(self, tensor: Any) -> None:
            key = id(tensor.untyped_storage())
            if tensor.device.type != "meta" and key not in self._live:
                size = tensor.untyped_storage().nbytes()
                self.made[key] = (self.phase, self.operation, size)
            before = self.peak
            super().track(tensor)
            if self.peak > before and self.peak >= self._snapshot_at + 2**18:  # every 256 KiB
                self.at_peak = [self.made[k] for k in self._live]
                self._snapshot_at = self.peak

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.operation = str(func).removeprefix("aten.")
            return super().__torch_dispatch__(func, types, args, kwargs)

    counter = PhaseCounter()

    class Phases(Callback):
        def on_train_batch_start(self, trainer: Any, *_: Any) -> None:
            counter.phase = f"s{trainer.global_step}:forward"

        def on_before_backward(self, trainer: Any, *_: Any) -> None:
            counter.phase = f"s{trainer.global_step}:backward"

        def on_before_optimizer_step(self, trainer: Any, *_: Any) -> None:
            counter.phase = f"s{trainer.global_step}:optimizer"

    return counter, Phases()


def cpu_groups(cli: Any) -> tuple[int, collections.Counter]:
    """The CPU run's largest live total (bytes made during the fit) and its groups."""
    counter, phases = phase_recorder()
    cli.trainer.callbacks.append(phases)
    gc.collect()
    with counter:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    groups: collections.Counter = collections.Counter()
    for phase, operation, size in counter.at_peak:
        groups[f"{phase} {operation}"] += size
    return counter.peak, groups


def _where(frames: Sequence[dict[str, Any]]) -> str:
    for frame in frames:
        name = frame.get("filename", "")
        for own in OWN_CODE:
            if own in name:
                return f"{own}{name.split(own, 1)[1]}:{frame.get('name', '?')}"
    return "elsewhere"


def cuda_groups(cli: Any) -> tuple[int, collections.Counter]:
    """The CUDA run's largest allocated total (what it held before the fit, weights, and the
    blocks of the fit's history alive at its peak) and those blocks, by allocation site."""
    import torch

    held = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    current = peak = peak_at = 0
    for index, event in enumerate(trace):  # the index of the peak, then the blocks alive there
        if event["action"] == "alloc":
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
        if current > peak:
            peak, peak_at = current, index
    alive: dict[int, dict[str, Any]] = {}
    for event in trace[: peak_at + 1]:
        if event["action"] == "alloc":
            alive[event["addr"]] = event
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    groups: collections.Counter = collections.Counter({"held before the fit (weights)": held})
    for event in alive.values():
        groups[_where(event.get("frames") or [])] += event["size"]
    return held + peak, groups


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a config under configs/")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=3, help="gpu_check.py's 1 + 2")
    parser.add_argument("--teacher-depth", type=int, default=gpu_check.GPU_TEACHER_DEPTH)
    parser.add_argument("--top", type=int, default=30, help="groups printed")
    args, extra = parser.parse_known_args(argv)
    config = next((c for c in gpu_check.shipped_configs() if c.name == args.config), None)
    if config is None:
        parser.error(f"--config {args.config}: not a shipped config (configs/<name>.yaml)")
    cuda = args.device == "cuda"
    size = ("build" if gpu_check.cpu_sized(config) else "real") if cuda else "cpu"  # as it checks
    cli = gpu_check.build(
        config,
        device=args.device,
        size=size,
        teacher_depth=args.teacher_depth if size == "real" else None,
        extra=[f"--trainer.max_steps={args.steps}", *extra],
    )
    peak, groups = (cuda_groups if cuda else cpu_groups)(cli)
    what = "CUDA's allocated blocks" if cuda else "storages made during the fit"
    print(
        f"{args.config} on {args.device}, {args.steps} steps: peak {peak / MIB:,.1f} MiB ({what})"
    )
    shown = 0
    for group, size in groups.most_common(args.top):
        shown += size
        print(f"{size / MIB:12,.1f} MiB  {group}")
    rest = max(len(groups) - args.top, 0)
    print(f"{(peak - shown) / MIB:12,.1f} MiB  in the {rest} other groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
