"""``radio-lit plan`` against what ``gpu_check.py`` measured: every config it stepped, planned
with the same one-device overrides (each partition one rank's share of the recipe's world,
teachers of ``--teacher-depth`` blocks, ``--gpus 1``), predicted beside measured.

    python benchmarks/gpu_check.py > gpu_check.txt
    python benchmarks/plan_check.py gpu_check.txt --gpu h200     # gpu_session.sh runs both

Prints one row per config: measured step ms and peak GiB (``gpu_check.py``'s table), the
plan's step ms and total GiB per rank, and their ratios (plan / measured); the tolerances
radio-lit states (benchmarks/README.md, "plan"): memory within 15 %, time within 25 %.
The plan runs on the host's CPUs (fake tensors); one config's failure is its row's note.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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


def plan_arguments(config: Path, depth: int, gpu: str) -> list[str]:
    """``radio-lit plan``'s command line for ``config`` as ``gpu_check.py`` stepped it."""
    raw = merged([config])
    args = ["--config", str(config), "--gpus", "1", "--gpu", gpu, "--json"]
    args += ["--teacher-depth", str(depth)]
    partitions = one_rank_partitions(raw, cpu=False)
    if partitions is not None:
        batch = sum(p["batch_size"] for p in partitions.values())
        args += [f"--model.partitions={json.dumps(partitions)}"]
        args += [f"--data.init_args.batch_size={batch}"]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measured", type=Path, help="gpu_check.py's output")
    parser.add_argument("--gpu", default="h200", help="the GPU gpu_check.py ran on")
    parser.add_argument("--teacher-depth", type=int, default=8, help="gpu_check.py's (8)")
    args = parser.parse_args(argv)
    from radio_lit.cli import plan

    rows = measured_rows(args.measured.read_text(encoding="utf-8"))
    print(f"{'config':<36}{'step ms':>9}{'plan':>9}{'ratio':>7}{'GiB':>8}{'plan':>8}{'ratio':>7}")
    for name, (ms, gib) in rows.items():
        config = ROOT / "configs" / name
        if own_module(merged([config])):
            print(f"{name:<36}  - (radio-lit plan plans distillation runs)")
            continue
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                plan.main(plan_arguments(config, args.teacher_depth, args.gpu))
            stage = json.loads(out.getvalue())
        except (Exception, SystemExit) as error:  # noqa: BLE001 (one row's failure)
            print(f"{name:<36}  - plan failed: {str(error).splitlines()[0][:80]}")
            continue
        total = max(r["memory_gib"]["total"] for r in stage["ranks"])
        step = stage["step_ms"]
        print(
            f"{name:<36}{ms:>9.1f}{step:>9.1f}{step / ms:>7.2f}{gib:>8.2f}{total:>8.2f}"
            f"{total / gib:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
