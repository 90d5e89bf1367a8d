"""A published RADIO model's outputs as teachers: one shared model against one entry per output.

Builds ``configs/recipes/shrink/quickstart.yaml`` (the CPU twin of the shrink recipes: a RADIO
model's backbone and three adaptor heads, four teachers of one file) twice, as
``benchmarks/harness.py`` builds configs: with ``share: true`` (the default: the model held
once, run once per view) and with ``share: false`` on every entry (each entry loads and runs
a model of its own, radio-lit's behaviour before sharing). Then, per side:

* ``teacher MiB``: the bytes of the teachers' parameters, each tensor counted once (what the
  run holds on its device for them);
* ``forwards``: the RADIO model's forward calls in one teacher stage of a step (the step's own
  :func:`radio_lit.training.teachers.run_teachers` on a batch of crops);
* ``teachers ms``: the median milliseconds of that stage (device-synchronised);
* ``step ms``: the median milliseconds of a whole training step (``harness.fit_times``: the
  loop, the teachers, the student's forward and backward; CPU only), statistics fitted once
  beforehand (no estimation while timed).

The RADIO model is an export in NVlabs' layout (``--model``, default a random-weight export of
the quickstart's student, made at the start: ``radio-lit export`` of an untrained
``configs/quickstart.yaml``; give ``published/quickstart.pth`` from the twin's header for the
trained one: the same sizes). The last line gives the ratios, shared over one entry per output.

    python benchmarks/radio_sharing.py                        # CPU, ~1 min on 2 shared cores
    python benchmarks/radio_sharing.py --model published/quickstart.pth --batch-size 16
    python benchmarks/radio_sharing.py --device cuda --steps 0

CPU times are of a shared machine unless it is quiet (say so when quoting them); the memory
and the forward counts do not depend on the load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import harness  # noqa: E402

TWIN = harness.ROOT / "configs" / "recipes" / "shrink" / "quickstart.yaml"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = harness.step_arguments(__doc__, "timed training steps per side (default 3; 0: none)")
    parser.set_defaults(config=str(TWIN))
    parser.add_argument("--model", default=None, help="a RADIO export (.pth); default: made")
    parser.add_argument("--batch-size", type=int, default=8, help="crops per step (default 8)")
    parser.add_argument("--iters", type=int, default=5, help="timed teacher stages (default 5)")
    return parser.parse_known_args(argv)


def quickstart_export(folder: Path) -> Path:
    """``radio-lit export --format radio`` of the quickstart's module as built (random weights;
    its PHI-S statistics fitted on one batch of the shipped photographs)."""
    from radio_lit.export import module_inference_model, save_radio

    cli = harness.build(harness.QUICKSTART, harness.BARE_TRAINER, max_steps=1)
    harness.fit_statistics(cli.model, harness.first_batch(cli.datamodule))
    return save_radio(module_inference_model(cli.model.eval()), folder / "quickstart.pth")


def teacher_bytes(teachers: Any) -> int:
    """Bytes of the teachers' parameters, each tensor once (a shared model counts once)."""
    seen: dict[int, int] = {}
    for teacher in teachers.values():
        for parameter in teacher.parameters():
            seen[parameter.data_ptr()] = parameter.numel() * parameter.element_size()
    return sum(seen.values())


def measure(args: argparse.Namespace, overrides: list[str], share: bool) -> dict[str, float]:
    """One side: the config built with every RADIO entry's ``share`` set, then its figures."""
    from radio_lit.data.views import as_float_images
    from radio_lit.teachers import RADIOTeacher
    from radio_lit.training.teachers import run_teachers

    raw = harness.load_config(args.config)
    entries = raw["model"]["teachers"]
    given = [f"--data.init_args.batch_size={args.batch_size}", *harness.BARE_TRAINER]
    for name in entries:
        given += [f"--model.teachers.{name}.init_args.model={args.model}"]
        given += [f"--model.teachers.{name}.init_args.share={str(share).lower()}"]
    cli = harness.build(args.config, [*given, *overrides], max_steps=1, device=args.device)
    module, device = cli.model, torch.device(args.device)
    batch = harness.first_batch(cli.datamodule)
    harness.fit_statistics(module, batch, device)
    teachers = dict(module.teachers)
    models = {id(t.model): t.model for t in teachers.values() if isinstance(t, RADIOTeacher)}
    calls = [0]
    for net in models.values():
        net.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    crop = as_float_images(batch.to(device))
    grid = module.partitions.grid(module.student_resolution)
    sync, times = harness.synchronizer(device), []
    for index in range(args.iters + 1):  # the first untimed
        sync()
        start = time.perf_counter()
        run_teachers(teachers, crop, list(teachers), grid)
        sync()
        if index:
            times.append(time.perf_counter() - start)
    forwards = calls[0] / (args.iters + 1)
    figures = {
        "teacher_mib": teacher_bytes(teachers) / 2**20,
        "models": len(models),
        "forwards": forwards,
        "teachers_ms": 1e3 * statistics.median(times),
    }
    if args.steps and device.type == "cpu":
        loader = harness.in_memory([batch] * (args.warmup + args.steps + 1))
        steps = harness.fit_times(module, loader, args.steps, args.warmup)
        figures["step_ms"] = 1e3 * statistics.median(steps)
    return figures


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args, overrides = parse_args(argv)
    harness.quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = tempfile.TemporaryDirectory(prefix="radio_sharing_")
    args.model = args.model or str(quickstart_export(Path(folder.name)))
    sides = {
        "one entry per output": measure(args, overrides, share=False),
        "one shared model": measure(args, overrides, share=True),
    }
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"{args.config}: {args.model}, batch {args.batch_size}, device {device}, "
        f"{torch.get_num_threads()} threads"
    )
    columns = ["teacher_mib", "models", "forwards", "teachers_ms", "step_ms"]
    print(f"{'':24}" + "".join(f"{c:>13}" for c in columns))
    for side, figures in sides.items():
        cells = [f"{figures[c]:>13.2f}" if c in figures else f"{'-':>13}" for c in columns]
        print(f"{side:24}" + "".join(cells))
    separate, shared = sides.values()
    ratios = {
        c: shared[c] / separate[c] for c in ("teacher_mib", "teachers_ms", "step_ms") if c in shared
    }
    print(
        "shared / one entry per output: "
        + ", ".join(f"{c} {value:.3f}" for c, value in ratios.items())
    )
    folder.cleanup()
    return sides


if __name__ == "__main__":
    main()
