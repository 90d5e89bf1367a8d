"""What TrainingProgressGuard costs a training step, against the step itself, in one process.

The config (default: the quickstart) is built by radio-lit's parser with random weights on one
device as ``benchmarks/train_step.py`` builds it (``benchmarks/harness.py``), its teacher
statistics fitted once on one batch of its data, and its Trainer fits that batch over and over,
with the callbacks ``benchmarks/train_step.py`` keeps and a
``TrainingProgressGuard(every_n_steps=2)``: every other step is a checked one (the copy of the
parameters before the update, the fused norms, the reduction and its one read), the others are
what most steps of a run are. The guard's own hooks are timed on each step, and so is each whole
step (from one ``on_train_batch_end`` to the next). Printed: the median step without the guard's
time, the median time of the guard on a checked and on an unchecked step, and the guard's share
of a run's time when it checks one step in ``--every`` (its default ``every_n_steps``; the first
update of each group is one such
check)::

    python benchmarks/progress_guard.py                       # the quickstart, CPU
    python benchmarks/progress_guard.py --config configs/stage1.yaml --teacher-depth 1
    python benchmarks/progress_guard.py --config configs/stage1.yaml --device cuda --teacher-depth 8
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    from benchmarks import harness

    parser = harness.step_arguments(__doc__, "timed steps (default 30)")
    parser.set_defaults(steps=30, warmup=3)
    parser.add_argument("--every", type=int, default=100, help="a run's steps per check")
    args, overrides = parser.parse_known_args(argv)
    args.batch_size = None
    return args, overrides


def timed_hooks(guard: Any, spent: list[float], synchronize: Any) -> None:
    """Add each call's time of ``guard``'s two hooks to ``spent[-1]``."""
    for name in ("on_before_optimizer_step", "on_train_batch_end"):
        hook = getattr(guard, name)

        @functools.wraps(hook)
        def timed(*args: Any, _hook: Any = hook, **kwargs: Any) -> Any:
            synchronize()
            start = time.perf_counter()
            try:
                return _hook(*args, **kwargs)
            finally:
                synchronize()
                spent[-1] += time.perf_counter() - start

        setattr(guard, name, timed)


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    import lightning.pytorch as pl
    import torch

    from benchmarks import harness
    from benchmarks.train_step import KEPT_CALLBACKS, device_overrides
    from radio_lit.callbacks import TrainingProgressGuard

    harness.quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    one_device, _ = device_overrides(harness.load_config(args.config), args)
    steps_run = args.warmup + args.steps
    cli = harness.build(
        args.config,
        [*one_device, *overrides],
        max_steps=steps_run,
        device=args.device,
        teacher_depth=args.teacher_depth,
    )
    batch = harness.first_batch(cli.datamodule)
    device = torch.device(args.device)
    harness.fit_statistics(cli.model, batch, device)  # as train_step.py: no estimation steps

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    guard = TrainingProgressGuard(every_n_steps=2)
    spent = [0.0]  # the guard's seconds, per step
    steps: list[float] = []  # the seconds of each whole step
    timed_hooks(guard, spent, synchronize)

    class StepClock(pl.Callback):
        def __init__(self) -> None:
            self.last = 0.0

        def on_train_batch_end(self, *_: Any) -> None:
            synchronize()
            now = time.perf_counter()
            if self.last:
                steps.append(now - self.last)
            self.last = now
            spent.append(0.0)

    trainer = cli.trainer
    kept = [
        c
        for c in trainer.callbacks
        if type(c).__name__ in KEPT_CALLBACKS and not isinstance(c, TrainingProgressGuard)
    ]
    trainer.callbacks[:] = [*kept, guard, StepClock()]  # StepClock's hook after the guard's
    trainer.fit(cli.model, train_dataloaders=harness.in_memory([batch] * steps_run))
    assert guard.checked_groups, "the guard checked nothing"
    # spent[k]: the guard's time in step k; steps[k - 1]: step k, from step k-1's end to its own
    measured = range(args.warmup, len(steps) + 1)
    step = statistics.median(steps[k - 1] - spent[k] for k in measured)
    check = statistics.median(spent[k] for k in measured if k % 2 == 0)
    idle = statistics.median(spent[k] for k in measured if k % 2 == 1)
    share = (check + (args.every - 1) * idle) / args.every / step
    print(f"config: {args.config} ({args.device}, {torch.get_num_threads()} threads)")
    print(f"step without the guard: {step * 1e3:.1f} ms (median of {len(measured)})")
    print(f"guard on a checked step: {check * 1e3:.2f} ms ({check / step:.1%} of a step)")
    print(f"guard on another step: {idle * 1e3:.3f} ms ({idle / step:.2%})")
    print(f"guard's share of a run checking one step in {args.every}: {share:.2%}")


if __name__ == "__main__":
    main()
