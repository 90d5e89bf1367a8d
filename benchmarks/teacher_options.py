"""Teachers' speed options (``speed:``) against the teacher as configured, in one command.

Builds a config's teachers (random weights, as ``benchmarks/harness.py`` builds them;
``--teacher-depth K`` keeps widths and shortens every teacher to K blocks) and, per teacher,
runs each option on the same crops of the shipped photographs (``radio_lit:sample_images``):

* ``eager``: the teacher as the config builds it (stage 1: ``dtype: bfloat16``): the baseline;
* ``attention <backend>``: every SDPA call on ``flash``, ``cudnn``, ``efficient`` or ``math``
  (a backend the device cannot run for this teacher is listed with the reason);
* ``compile [<mode>]``: its encoder through ``torch.compile`` with static shapes (inductor on
  a GPU; ``--cpu-backend``, default ``aot_eager``, on a CPU, where inductor takes minutes);
  ``+ <backend>`` with the fastest SDPA backend found; compile time reported;
* ``fp8 <scaling>`` (eager and compiled): torchao FP8 linear layers, on a GPU of compute
  capability 8.9+ only (skipped with the reason elsewhere).

Per option: median milliseconds per forward (device-synchronised), the speed-up over
``eager``, top-level aten operations and (CUDA) kernel launches of one forward, and the
features' and summary's mean per-token cosine and relative L2 error against ``eager``. Then, with
an FP8-capable GPU, a short run trained on FP8 targets against one trained on the eager
teachers' (``--fidelity-steps``, same seed, data and statistics estimation), both validated
against the eager teachers: ``val/<teacher>/fidelity`` (PHI-S eq. 51) of each.

    python benchmarks/teacher_options.py --config configs/stage1.yaml --device cuda
    python benchmarks/teacher_options.py --config configs/stage1.yaml --teacher-depth 1 \\
        --batch-size 2                             # CPU: FP8 parts skipped, ~5 min shared
    python benchmarks/teacher_options.py --modes default,max-autotune --device cuda ...

CPU times are of a shared machine unless it is quiet (say so when quoting them); the
operation counts and the cosines do not depend on the load.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.dispatch import count_events  # noqa: E402

BACKENDS = ("flash", "cudnn", "efficient", "math")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other arguments (--model.*, --trainer.*) go to radio-lit's parser.",
    )
    parser.add_argument("--config", default=str(harness.QUICKSTART))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--teacher-depth", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the config's")
    parser.add_argument("--teachers", default=None, help="comma-separated subset")
    parser.add_argument("--iters", type=int, default=None, help="timed forwards (10 / 2 CPU)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed forwards per option")
    parser.add_argument("--modes", default="default", help="torch.compile modes (GPU)")
    parser.add_argument("--cpu-backend", default="aot_eager", help="torch.compile on a CPU")
    parser.add_argument("--fp8", default="rowwise,tensorwise", help="FP8 scalings to run")
    parser.add_argument("--fidelity-steps", type=int, default=60, help="0: no training run")
    parser.add_argument("--json", default=None, help="write the results here as well")
    args, overrides = parser.parse_known_args(argv)
    args.iters = args.iters or (10 if args.device == "cuda" else 2)
    return args, overrides


# ------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------
def build(args: argparse.Namespace, overrides: list[str]) -> Any:
    """The config's ``RadioLitCLI`` (``run=False``) with random weights (and
    ``--teacher-depth``), one device, the shipped photographs as data
    (:mod:`benchmarks.harness`)."""
    config = harness.load_config(args.config)
    data = (config.get("data") or {}).get("init_args") or {}
    args.batch_size = args.batch_size or int(data.get("batch_size", 8))
    args.crop = int(data.get("crop_size", 256))
    precision = "bf16-mixed" if args.device == "cuda" else "32-true"
    trainer, _ = harness.one_device(config, strategy="auto")
    repeats = max(1, args.batch_size * args.fidelity_steps // 10 + 1)
    return harness.build(
        args.config,
        [
            *trainer,
            *harness.BARE_TRAINER,
            f"--trainer.precision={precision}",
            *harness.photographs(args.crop, args.batch_size, repeats, validation=True),
            *overrides,
        ],
        max_steps=max(args.fidelity_steps, 1),
        device=args.device,
        teacher_depth=args.teacher_depth,
    )


def sample_crops(side: int, count: int) -> Tensor:
    """``count`` crops ``[count, 3, side, side]`` in ``[0, 1]`` of the shipped photographs: each
    photograph's center crop, then seeded random-resized crops."""
    from radio_lit.data.image_folder import SAMPLE_IMAGES
    from radio_lit.data.views import as_float_images
    from radio_lit.teachers.rescaled import calibration_views

    views = -(-count // 10)  # 10 photographs
    return as_float_images(calibration_views(SAMPLE_IMAGES, side, views, seed=0)[:count])


def fidelity(output: Tensor | None, reference: Tensor | None) -> tuple[float, float]:
    """Mean cosine over the last dim (per token / per image) and relative L2 error
    ``||output - reference|| / ||reference||`` (both float32), or NaNs without a tensor."""
    if output is None or reference is None:
        return float("nan"), float("nan")
    a, b = output.float().flatten(0, -2), reference.float().flatten(0, -2)
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1).mean().item()
    return cosine, ((a - b).norm() / b.norm()).item()


# ------------------------------------------------------------------------------------------
# one option on one teacher
# ------------------------------------------------------------------------------------------
@dataclass
class Row:
    option: str
    ms: float = float("nan")
    top_level: int = 0
    launches: int = 0
    compile_s: float = float("nan")
    graphs: int = 0
    features: tuple[float, float] = (float("nan"), float("nan"))
    summary: tuple[float, float] = (float("nan"), float("nan"))
    note: str = ""


def measure(
    option: str, run: Callable[[], Any], reference: Any, args: argparse.Namespace, device: Any
) -> tuple[Row, Any]:
    """``run()`` once (its outputs are compared), ``--warmup`` more (at least one), ``--iters``
    timed; one profiled."""
    row, sync = Row(option), harness.synchronizer(device)
    out = run()
    for _ in range(max(1, args.warmup)):  # the second call compiles after an attention check
        run()
    times = []
    for _ in range(args.iters):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    row.ms = statistics.median(times)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        sync()
    events = prof.events()
    row.top_level = count_events(events).top_level
    row.launches = sum(1 for e in events if "LaunchKernel" in e.name or e.name == "cudaGraphLaunch")
    if reference is not None:
        row.features = fidelity(out.features, reference.features)
        row.summary = fidelity(out.summary, reference.summary)
    return row, out


def options_of(args: argparse.Namespace, device: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(label, TeacherSpeed fields)`` of every option but FP8's, in order."""
    rows: list[tuple[str, dict[str, Any]]] = [("eager", {})]
    rows += [(f"attention {b}", {"attention": b}) for b in BACKENDS]
    if device.type == "cuda":
        for mode in args.modes.split(","):
            kwargs = {} if mode == "default" else {"mode": mode}
            rows.append((f"compile {mode}", {"compile": kwargs or True}))
    else:
        rows.append((f"compile {args.cpu_backend}", {"compile": {"backend": args.cpu_backend}}))
    return rows


def run_teacher(
    name: str, teacher: Any, crops: Tensor, args: argparse.Namespace, shapes: int
) -> list[Row]:
    """Every option on ``teacher`` (a pristine copy is kept for FP8, which changes weights)."""
    from radio_lit.core.errors import ConfigError
    from radio_lit.teachers.speed import TeacherSpeed, fp8_refusal

    device = crops.device
    pristine = copy.deepcopy(teacher).cpu()

    def with_speed(target: Any, fields: dict[str, Any]) -> Callable[[], Any]:
        target.speed_runner = None
        target.freeze(target.channels_last, TeacherSpeed(**fields) if fields else None)
        return lambda: target(crops)

    rows: list[Row] = []
    reference = None
    fastest: tuple[float, str] | None = None
    for label, fields in options_of(args, device):
        torch._dynamo.reset()
        try:
            row, out = measure(label, with_speed(teacher, fields), reference, args, device)
        except ConfigError as refused:
            rows.append(Row(label, note=_refusal(refused)))
            continue
        if reference is None:
            reference, row.note = out, "the reference"
        runner = teacher.speed_runner
        if runner is not None and runner.compiled is not None:
            row.compile_s, row.graphs = runner.compiled.stats.seconds, runner.compiled.stats.graphs
        if "attention" in fields and (fastest is None or row.ms < fastest[0]):
            fastest = (row.ms, fields["attention"])
        rows.append(row)
    compile_fields = options_of(args, device)[-1][1]
    if fastest is not None:
        torch._dynamo.reset()
        fields = {**compile_fields, "attention": fastest[1]}
        row, _ = measure(
            f"compile + {fastest[1]}", with_speed(teacher, fields), reference, args, device
        )
        row.compile_s = teacher.speed_runner.compiled.stats.seconds
        row.graphs = teacher.speed_runner.compiled.stats.graphs
        rows.append(row)
    teacher.speed_runner = None
    reason = fp8_refusal(device)
    for scaling in [s for s in args.fp8.split(",") if s]:
        for compiled in (False, True):
            label = f"fp8 {scaling}" + (" + compile" if compiled else "")
            if reason is not None:
                rows.append(Row(label, note=f"skipped: {reason}"))
                continue
            torch._dynamo.reset()
            target = copy.deepcopy(pristine).to(device)
            fields = {"fp8": scaling, **(compile_fields if compiled else {})}
            try:
                row, _ = measure(label, with_speed(target, fields), reference, args, device)
            except ConfigError as refused:
                rows.append(Row(label, note=_refusal(refused)))
                continue
            done, total = target.speed_runner.fp8_layers
            row.note = f"{done}/{total} linear layers in FP8"
            rows.append(row)
            del target
    print(f"\nteacher {name}: {type(teacher).__name__}, {shapes} input shape(s) in this config")
    print_rows(rows)
    return rows


def _refusal(error: Exception) -> str:
    """The reason of a teacher's one-line refusal, without its config key and advice."""
    return "refused: " + str(error).split(": ", 1)[-1].split(" (or leave")[0]


def print_rows(rows: list[Row]) -> None:
    def number(value: float, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if value != value else f"{value:{width}.{digits}f}"

    print(
        f"{'option':26}{'ms':>9}{'x eager':>9}{'aten top':>10}{'launches':>10}{'compile s':>11}"
        f"{'graphs':>8}{'feat cos':>10}{'feat rel':>10}{'sum cos':>10}{'sum rel':>10}  note"
    )
    for r in rows:
        ran = r.ms == r.ms
        print(
            f"{r.option:26}{number(r.ms, 9, 2)}{number(rows[0].ms / r.ms if ran else r.ms, 9, 2)}"
            f"{r.top_level if ran else '-':>10}{r.launches if ran else '-':>10}"
            f"{number(r.compile_s, 11, 1)}{r.graphs if r.graphs else '-':>8}"
            f"{number(r.features[0], 10, 5)}{number(r.features[1], 10, 5)}"
            f"{number(r.summary[0], 10, 5)}{number(r.summary[1], 10, 5)}  {r.note}"
        )


# ------------------------------------------------------------------------------------------
# a short run on FP8 targets
# ------------------------------------------------------------------------------------------
def fidelity_runs(cli: Any, pristine: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``--fidelity-steps`` on the eager teachers' targets, and again (same seed, data,
    statistics estimation) on FP8 teachers' (rowwise); validate both students against the eager
    teachers. Returns the two runs' ``val/*`` metrics."""
    import lightning.pytorch as pl

    from radio_lit.callbacks import TeacherStatsEstimation
    from radio_lit.teachers.speed import TeacherSpeed

    steps = args.fidelity_steps
    results = {}
    eager_teachers = None
    for label in ("eager targets", "fp8 targets"):
        module = copy.deepcopy(pristine)
        if label == "fp8 targets":
            for teacher in module.teachers.values():
                teacher.freeze(teacher.channels_last, TeacherSpeed(fp8="rowwise"))
        pl.seed_everything(0)
        trainer = harness.trainer(
            accelerator=args.device,
            precision=cli.trainer.precision,
            max_steps=steps,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[TeacherStatsEstimation(steps=max(1, steps // 3), refit_every=5)],
        )
        trainer.fit(module, datamodule=cli.datamodule)
        if eager_teachers is None:
            eager_teachers = module.teachers
        module.teachers = eager_teachers  # validated against the eager teachers' outputs
        check = harness.trainer(accelerator=args.device, precision=cli.trainer.precision)
        results[label] = check.validate(module, datamodule=cli.datamodule, verbose=False)[0]
    names = list(pristine.teachers)
    print(f"\nfidelity after {steps} steps, validated against the eager teachers (PHI-S eq. 51)")
    print(f"{'teacher':16}{'eager targets':>15}{'fp8 targets':>15}{'ratio':>8}")
    for name in [*names, "geomean"]:
        key = "val/fidelity_geomean" if name == "geomean" else f"val/{name}/fidelity"
        a, b = (results[label].get(key, float("nan")) for label in results)
        print(f"{name:16}{a:15.4f}{b:15.4f}{b / a:8.4f}")
    return results


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    from radio_lit.cache.manifest import view_sizes
    from radio_lit.teachers.speed import fp8_refusal

    cli = build(args, overrides)
    module = cli.model
    device = torch.device(args.device)
    reason = fp8_refusal(device)
    pristine = copy.deepcopy(module) if args.fidelity_steps and reason is None else None
    sizes = view_sizes(dict(module.teachers), module.partitions, module.student.patch_size)
    crops = sample_crops(args.crop, args.batch_size).to(device)
    print(
        f"{args.config}: batch {args.batch_size}, {args.crop} px crops of the shipped photographs, "
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
        + (f", teachers shortened to {args.teacher_depth} blocks" if args.teacher_depth else "")
    )
    if device.type == "cpu":
        print("CPU times are of this machine as loaded now; counts and cosines are not")
    chosen = args.teachers.split(",") if args.teachers else list(module.teachers)
    results: dict[str, Any] = {"teachers": {}}
    for name in chosen:
        teacher = module.teachers[name].to(device)
        rows = run_teacher(name, teacher, crops, args, len(sizes[name]))
        results["teachers"][name] = [vars(r) for r in rows]
        module.teachers[name].cpu()
    if pristine is not None:
        results["fidelity"] = fidelity_runs(cli, pristine, args)
    elif args.fidelity_steps:
        print(f"\nfidelity of a run on FP8 targets: skipped ({reason})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
