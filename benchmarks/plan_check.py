"""``radio-lit plan`` against what ``gpu_check.py`` measured: every config it stepped, planned
with the same one-device overrides (each partition one rank's share of the recipe's world,
teachers of ``--teacher-depth`` blocks, ``--gpus 1``), predicted beside measured.

    python benchmarks/gpu_check.py > gpu_check.txt
    python benchmarks/plan_check.py gpu_check.txt --gpu h200     # gpu_session.sh runs both
    python benchmarks/plan_check.py --draws recipes/c-radio/stage1.yaml --measured-gib 42.91

Prints one row per config: measured step ms and peak GiB (``gpu_check.py``'s table), the
plan's step ms and total GiB per rank, and their ratios (plan / measured); the tolerances
radio-lit states (benchmarks/README.md, "plan"): memory within 15 %, time within 25 %.
The plan runs on the host's CPUs (fake tensors); one config's failure is its row's note.

``--draws CONFIG``: a config whose partitions draw their resolution at random, as
``gpu_check.py`` stepped it: the plan's peak at every combination of the partitions'
resolutions (one ``radio-lit plan`` per combination, each partition at one size), and the
distribution of the largest of ``--steps`` independent draws (``gpu_check.py``'s warm-up and
timed steps: its peak is the largest of theirs), beside ``--measured-gib``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_check import merged, one_rank_partitions, own_module  # noqa: E402


def measured_rows(text: str) -> dict[str, tuple[float, float]]:
    """``{config: (step ms, peak GiB)}`` of the passing rows of ``gpu_check.py``'s table."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith(".yaml") and parts[1] == "pass":
            try:
                rows[parts[0]] = (float(parts[2]), float(parts[3]))
            except ValueError:
                continue
    return rows


#: The step of ``gpu_check.py``'s largest peak: its warm-up step 0 holds no earlier
#: gradients or optimizer state, its timed steps 1 and 2 do (a config's ``FreezeBody`` still
#: holds the trunk there).
MEASURED_STEP = 1


def plan_arguments(config: Path, depth: int, gpu: str, calibration: str | None = None) -> list[str]:
    """``radio-lit plan``'s command line for ``config`` as ``gpu_check.py`` stepped it (with
    ``calibration``: ``--calibration`` of that file, e.g. ``radio-lit plan --calibrate``'s)."""
    raw = merged([config])
    args = ["--config", str(config), "--gpus", "1", "--gpu", gpu, "--json"]
    if calibration is not None:
        args += ["--calibration", calibration]
    args += ["--teacher-depth", str(depth), "--step", str(MEASURED_STEP)]
    partitions = one_rank_partitions(raw, cpu=False)
    if partitions is not None:
        batch = sum(p["batch_size"] for p in partitions.values())
        args += [f"--model.partitions={json.dumps(partitions)}"]
        args += [f"--data.init_args.batch_size={batch}"]
    return args


def planned(args: list[str]) -> dict:
    """``radio-lit plan``'s ``--json`` figures of the command line ``args`` (with ``--json``)."""
    from radio_lit.cli import plan

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plan.main(args)
    return json.loads(out.getvalue())


def largest_total(stage: dict) -> float:
    """The largest memory per rank (GiB) of a stage's plan."""
    return max(r["memory_gib"]["total"] for r in stage["ranks"])


def draw_peaks(config: Path, depth: int, gpu: str) -> dict[tuple[int, ...], tuple[float, float]]:
    """``{resolutions: (chance, planned peak GiB)}`` of every combination of the draws of
    ``config``'s partitions (one rank's share of each, as :func:`plan_arguments`)."""
    raw = merged([config])
    partitions = one_rank_partitions(raw, cpu=False) or {}
    names = list(partitions)
    sizes = [partitions[n].get("resolutions") or [None] for n in names]
    chances = []
    for name, options in zip(names, sizes, strict=True):
        given = partitions[name].get("probabilities") or [1.0] * len(options)
        chances.append([c / sum(given) for c in given])
    base = plan_arguments(config, depth, gpu)
    out = {}
    for combo in itertools.product(*(range(len(o)) for o in sizes)):
        fixed = {}
        for name, options, index in zip(names, sizes, combo, strict=True):
            spec = {**partitions[name], "probabilities": None}
            if options[index] is not None:
                spec["resolutions"] = [options[index]]
            fixed[name] = spec
        stage = planned([*base, f"--model.partitions={json.dumps(fixed)}"])
        key = tuple(o[i] for o, i in zip(sizes, combo, strict=True))
        out[key] = (
            math.prod(c[i] for c, i in zip(chances, combo, strict=True)),
            largest_total(stage),
        )
    return out


def largest_of_steps(
    peaks: dict[tuple, tuple[float, float]], steps: int
) -> list[tuple[float, float]]:
    """``[(peak GiB, chance)]``: the distribution of the largest peak of ``steps`` steps
    drawing independently, from one step's ``peaks`` (:func:`draw_peaks`), ascending."""
    values = sorted((gib, chance) for chance, gib in peaks.values())
    out, below = [], 0.0
    for gib, chance in values:
        cdf = below + chance
        out.append((gib, cdf**steps - below**steps))
        below = cdf
    return out


def _draws_report(args: argparse.Namespace) -> int:
    config = ROOT / "configs" / args.draws
    peaks = draw_peaks(config, args.teacher_depth, args.gpu)
    print(f"{args.draws}: the plan's peak (GiB) at each draw of the partitions' resolutions")
    for sizes, (chance, gib) in sorted(peaks.items(), key=lambda kv: kv[1][1]):
        print(f"  {' + '.join(f'{s} px' for s in sizes):<22}{gib:>8.2f}   chance {chance:.3f}")
    spread = largest_of_steps(peaks, args.steps)
    cdf, median = 0.0, None
    for gib, chance in spread:
        cdf += chance
        if median is None and cdf >= 0.5:
            median = gib
    print(
        f"largest of {args.steps} steps: median {median:.2f} GiB, range {spread[0][0]:.2f}"
        f"-{spread[-1][0]:.2f} GiB"
    )
    if args.measured_gib is not None:
        at_most = sum(c for g, c in spread if g <= args.measured_gib * 1.15)
        near = sum(c for g, c in spread if abs(g / args.measured_gib - 1) <= 0.15)
        print(
            f"measured {args.measured_gib:.2f} GiB: "
            f"median / measured {median / args.measured_gib:.2f}; "
            f"chance of a {args.steps}-step peak within 15 % of it {near:.2f} "
            f"(at most 15 % above it {at_most:.2f})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measured", type=Path, nargs="?", help="gpu_check.py's output")
    parser.add_argument("--gpu", default="h200", help="the GPU gpu_check.py ran on")
    parser.add_argument("--teacher-depth", type=int, default=8, help="gpu_check.py's (8)")
    parser.add_argument("--draws", help="a config under configs/: its peak at every draw")
    parser.add_argument("--steps", type=int, default=3, help="gpu_check.py's steps (1 + 2)")
    parser.add_argument("--measured-gib", type=float, default=None)
    parser.add_argument(
        "--calibration",
        default=None,
        help="plan with this calibration (radio-lit plan --calibrate)",
    )
    args = parser.parse_args(argv)
    if args.draws:
        return _draws_report(args)
    if args.measured is None:
        parser.error("give gpu_check.py's output, or --draws CONFIG")

    rows = measured_rows(args.measured.read_text(encoding="utf-8"))
    print(f"{'config':<36}{'step ms':>9}{'plan':>9}{'ratio':>7}{'GiB':>8}{'plan':>8}{'ratio':>7}")
    for name, (ms, gib) in rows.items():
        config = ROOT / "configs" / name
        if own_module(merged([config])):
            print(f"{name:<36}  - (radio-lit plan plans distillation runs)")
            continue
        try:
            stage = planned(plan_arguments(config, args.teacher_depth, args.gpu, args.calibration))
        except (Exception, SystemExit) as error:  # noqa: BLE001 (one row's failure)
            print(f"{name:<36}  - plan failed: {str(error).splitlines()[0][:80]}")
            continue
        total = largest_total(stage)
        step = stage["step_ms"]
        print(
            f"{name:<36}{ms:>9.1f}{step:>9.1f}{step / ms:>7.2f}{gib:>8.2f}{total:>8.2f}"
            f"{total / gib:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
