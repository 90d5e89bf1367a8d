"""C-RADIOv4's training parts: the step with all of them on against today's step.

One process, ``configs/quickstart-c-radio.yaml`` read with radio-lit's own CLI parser, built
once per side: **all on** (the config: shifted views, angle-balanced summaries, EMA student
and MESA, DAMP) and **today** (the same config with ``model.shifts``, ``model.mesa`` and
``model.damp`` null and the cosine summary loss); ``--parts`` adds one side per part alone.
Both sides keep the config's partitions and ViTDet windows (older options), each partition
at one resolution (its largest: 64 and 128 px), since the sides draw different random numbers
and a per-step resolution draw would then differ between them. (The windows' per-step draw,
``vitdet_probability``, depends on the seed and step number only: both sides run the same
steps windowed.) Timing is ``benchmarks/cache.py``'s (``harness.fit_times``): a real
``Trainer`` per fit, the time between consecutive
``on_train_batch_start`` calls, sides interleaved over ``--repeats`` fits, the first
``--warmup`` steps of each fit dropped, medians compared; statistics fitted once on one batch
beforehand (no estimation while timed).

    python benchmarks/c_radio_step.py --threads 2          # ~3 min on 2 quiet CPU cores
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402

_CONFIG = harness.ROOT / "configs" / "quickstart-c-radio.yaml"
_OFF = {
    "shifts": "--model.shifts=null",
    "mesa": "--model.mesa=null",
    "damp": "--model.damp=null",
    "angle": "--model.summary_loss=radio_lit.losses.Cosine",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per fit (10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per fit (2)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved fits per side (3)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--parts", action="store_true", help="also time each part alone")
    return parser.parse_args(argv)


def _module(off: list[str]) -> tuple[Any, Any]:
    """The config's module with the parts ``off`` switched off, and its training batches."""
    cli = harness.parse(
        _CONFIG,
        *harness.BARE_TRAINER,
        "--trainer.accelerator=cpu",
        "--model.partitions.low.resolutions=[64]",
        "--model.partitions.high.resolutions=[128]",
        "--model.partitions.high.probabilities=null",
        *[_OFF[name] for name in off],
    )
    harness.quiet()
    batch = harness.first_batch(cli.datamodule)
    harness.fit_statistics(cli.model, batch)  # once, on one batch
    return cli.model, harness.in_memory([batch] * 64)


def main(argv: list[str] | None = None) -> None:
    import torch

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sides = {"today": list(_OFF), "all on": []}
    if args.parts:
        sides.update({f"{part} alone": [p for p in _OFF if p != part] for part in _OFF})
    built = {name: _module(off) for name, off in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, (module, loader) in built.items():
            times[name] += harness.fit_times(module, loader, args.steps, args.warmup)
    today = statistics.median(times["today"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>14}: {median * 1000:7.1f} ms/step  ({median / today:.2f}x today)")
    print(f"ratio (all on / today): {statistics.median(times['all on']) / today:.2f}")


if __name__ == "__main__":
    main()
