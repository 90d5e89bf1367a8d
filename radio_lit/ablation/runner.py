"""``radio-lit ablate``: train every ablation row and write the PHI-S tables.

Each row is a real ``radio-lit fit --config BASE --config ROW [overrides]`` in a process of its
own (the same CLI a user runs), with its TensorBoard logs in ``OUT/tensorboard/<row>/`` beside the
other rows', its console output in ``OUT/logs/<row>.log`` and its final validation metrics
(:class:`~radio_lit.ablation.FinalValidation`) in ``OUT/rows/<row>.json``. A row with a result
file is not run again, so an interrupted ablation resumes where it stopped. At the end the
runner writes ``OUT/results.csv`` (rows x metrics) and one markdown table per paper table
(``OUT/<table>.md``, :mod:`radio_lit.ablation.tables`) and prints them.

    radio-lit ablate                                   # the twelve rows, small scale, CPU
    radio-lit ablate --rows MSE PHI-S --trainer.max_steps 100
    radio-lit ablate --base configs/stage1.yaml --out runs/phi-s-ablations   # real scale
    radio-lit ablate --cache runs/ablations-cache --seeds 3   # teachers once, 3 seeds per row

``--cache DIR`` runs the teachers once for all rows: ``radio-lit cache --views epochs`` writes
the base's views to ``DIR`` (kept, and reused by later ablations with the same base), and
every row trains from it (``data: radio_lit.cache.CachedViews``), the same run as a live one
(the rows differ after the teachers: normalizer, loss, balancer). ``--seeds N`` trains each
row with seeds 0 (the base's ``seed_everything``) to N-1 and prints mean ± std tables, marking
with ``≈`` the values within the seeds' spread of their column's best. The seed draws the
student's initialization and the step's randomness; the data (the base's ``data.seed``) is
the same for every seed. A run from the cache does not build its teachers
(:class:`~radio_lit.cache.CachedTeacher`), so one cache serves every seed: with
random-weight teachers, all rows train against those the cache was written with (the
base seed's).

The rows' processes are forked from a ``multiprocessing`` fork server that has imported torch,
Lightning and radio-lit once (it computes nothing, so forking it is safe): a row costs a fork,
not the seconds of imports a fresh interpreter pays. A row's process runs
``radio_lit.cli.main`` with ``sys.argv`` set to the ``radio-lit fit`` command it stands for, so
Lightning's launcher starts the other ranks of a multi-device base with that command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radio_lit.ablation.final_validation import write_json
from radio_lit.ablation.rows import ROWS, Row, default_rows_dir, resolve_rows
from radio_lit.ablation.tables import all_tables, write_csv
from radio_lit.errors import CommandParser

__all__ = ["main", "run_ablation"]

#: Seconds between two progress lines of a running row.
REPORT_EVERY = 20.0


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}:{secs:02d}"


def _parser() -> argparse.ArgumentParser:
    rows_dir = default_rows_dir()
    parser = CommandParser(
        prog="radio-lit ablate",
        description=(
            "Train the PHI-S ablation rows (tables 1 and 12) one after the other and write the "
            "paper's tables (teacher MSE, fidelity, error-variance ranges, mean ranks). Any "
            "other --section.key value option is passed to every row's radio-lit fit."
        ),
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=list(ROWS),
        metavar="ROW",
        help=f"rows to run, paper names or file names (default: all: {', '.join(ROWS)})",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=rows_dir / "base.yaml",
        help="base config every row overrides (default: the small-scale CPU base, %(default)s)",
    )
    parser.add_argument(
        "--rows-dir",
        type=Path,
        default=rows_dir,
        help="folder of the rows' override configs (default: %(default)s)",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds per row; tables show mean ± std (default 1)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="teacher-feature cache folder: written once (radio-lit cache), then every row "
        "trains from it",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs") / "ablations",
        help="output folder: logs, TensorBoard runs, results, tables (default: %(default)s)",
    )
    return parser


def main(argv: Sequence[str]) -> None:
    """Entry point of ``radio-lit ablate``; exits with status 1 if a row failed."""
    parser = _parser()
    args, overrides = parser.parse_with_overrides(argv)
    if not args.base.is_file():
        parser.error(f"--base {args.base}: no such config file")
    try:
        rows = resolve_rows(args.rows, args.rows_dir)
    except ValueError as err:
        parser.error(f"--rows: {err}")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    try:
        failed = run_ablation(rows, args.base, overrides, args.out, args.seeds, args.cache)
    except ValueError as err:
        parser.error(str(err))
    if failed:
        sys.exit(1)


#: Imported once by the rows' fork server (a module that is not installed is skipped).
PRELOAD = [
    "torch",
    "lightning.pytorch",
    "open_clip",
    "timm",
    "segment_anything",
    "radio_lit.cli",
    "radio_lit.module",
    "radio_lit.teachers",
    "radio_lit.callbacks",
    "radio_lit.ablation",
    "radio_lit.cache.writer",
]


@dataclass
class Command:
    """What a row's process runs: ``function(args)`` (``"module:function"``), the function of
    the ``radio-lit`` command ``args`` (e.g. ``radio_lit.cli:main`` for ``fit …``)."""

    function: str
    args: list[str]


def _launcher() -> str:
    """The ``radio-lit`` executable Lightning's launcher restarts a row's other ranks with."""
    found = shutil.which("radio-lit")
    return found if found is not None else os.path.abspath(sys.argv[0])


def _process_main(command: Command, log_path: str, launcher: str) -> None:
    """A row's process: its output to ``log_path``, then ``command`` as ``radio-lit``; the
    processes it starts import this radio_lit first."""
    multiprocessing.set_start_method(None, force=True)  # its DataLoader workers: the default
    root = str(Path(__file__).resolve().parents[2])
    paths = (root, os.environ.get("PYTHONPATH"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    sys.argv = [launcher, *command.args]
    module, name = command.function.split(":")
    getattr(importlib.import_module(module), name)(command.args)


def _start(command: Command, log_path: Path) -> Any:
    """Fork ``command`` from the fork server; returns the started process."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    process = context.Process(target=_process_main, args=(command, str(log_path), _launcher()))
    process.start()
    return process


def _seed_overrides(seed: int) -> list[str]:
    """Seed 0 is the base's own ``seed_everything``."""
    return [] if seed == 0 else ["--seed_everything", str(seed)]


def _write_cache(base: Path, overrides: list[str], folder: Path, out: Path) -> None:
    """``radio-lit cache`` for the base (the rows share its teachers and data)."""
    log_path = out / "logs" / "cache.log"
    args = ["cache", "--config", str(base), *overrides]
    args += ["--out", str(folder), "--views", "epochs"]
    start = time.monotonic()
    print(f"cache: writing the teachers' outputs to {folder}", flush=True)
    process = _start(Command("radio_lit.cli:main", args), log_path)
    process.join()
    status = process.exitcode
    if status != 0:
        raise ValueError(
            f"radio-lit cache failed (exit {status}), see {log_path}:\n{_tail(log_path)}"
        )
    print(f"cache: ready in {_clock(time.monotonic() - start)}", flush=True)


def _fit_command(row: Row, base: Path, overrides: list[str], out: Path) -> Command:
    """The row's ``radio-lit fit``: the base, the row's file, the overrides, its logger and
    :class:`~radio_lit.ablation.FinalValidation`."""
    logger = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(out), "name": "tensorboard", "version": row.slug},
    }
    final = {
        "class_path": "radio_lit.ablation.FinalValidation",
        "init_args": {
            "metrics_file": str(out / "rows" / f"{row.slug}.metrics.json"),
            "progress_file": str(out / "rows" / f"{row.slug}.progress.json"),
        },
    }
    args = ["fit", "--config", str(base), "--config", str(row.config), *overrides]
    args += ["--trainer.logger", json.dumps(logger), "--trainer.callbacks+", json.dumps(final)]
    return Command("radio_lit.cli:main", args)


class _Progress:
    """Row i of n, steps, elapsed and time left.

    The time left comes from measured time per step: the finished rows' wall time (start-up
    and final validation included) over their steps, times the steps still to run in this
    row and the rows after it. Before any row has finished, the running row's own rate since
    its first reported step is used, plus its start-up time for each row after it.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.monotonic()
        self.finished: list[tuple[float, int]] = []  # (seconds, steps) of the finished rows
        self._first: tuple[float, int] | None = None  # (time, step) first seen in this row

    def row_done(self, seconds: float, steps: int) -> None:
        self.finished.append((seconds, steps))
        self._first = None

    def seconds_left(
        self, index: int, row_elapsed: float, step: int, max_steps: int, now: float
    ) -> float | None:
        """Estimated seconds until the last row is done, ``None`` before anything is known."""
        rows_after = self.total - index
        if self.finished:
            per_step = sum(s for s, _ in self.finished) / max(sum(n for _, n in self.finished), 1)
            steps = max_steps if max_steps > 0 else self.finished[-1][1]
            this_row = max(per_step * steps - row_elapsed, 0.0)
            return this_row + per_step * steps * rows_after
        if step <= 0 or max_steps <= 0:
            return None
        if self._first is None or step < self._first[1]:
            self._first = (now, step)
            return None
        first_time, first_step = self._first
        if step == first_step:
            return None
        per_step = (now - first_time) / (step - first_step)
        start_up = max(row_elapsed - (now - first_time) - per_step * first_step, 0.0)
        return per_step * (max_steps - step) + (start_up + per_step * max_steps) * rows_after

    def line(self, index: int, row: Row, row_start: float, step: int, max_steps: int) -> str:
        now = time.monotonic()
        row_elapsed = now - row_start
        steps = f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"
        left = self.seconds_left(index, row_elapsed, step, max_steps, now)
        estimate = "time left not known yet" if left is None else f"about {_clock(left)} left"
        if left is not None and left == 0.0:
            estimate = "finishing"
        return (
            f"[{index}/{self.total}] {row.name}: {steps}, {_clock(row_elapsed)} in this row, "
            f"{_clock(now - self.start)} elapsed, {estimate}"
        )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join("    " + line for line in text[-lines:])


def _run_row(row: Row, index: int, command: Command, out: Path, progress: _Progress) -> int:
    """Run one row's fit, printing progress; returns its exit status."""
    progress_file = out / "rows" / f"{row.slug}.progress.json"
    for stale in (progress_file, out / "rows" / f"{row.slug}.metrics.json"):
        stale.unlink(missing_ok=True)
    log_dir = out / "tensorboard" / row.slug
    if log_dir.is_dir():  # a failed earlier attempt: start its logs afresh
        for event_file in log_dir.glob("events.out.tfevents.*"):
            event_file.unlink()
    log_path = out / "logs" / f"{row.slug}.log"
    row_start = time.monotonic()
    print(progress.line(index, row, row_start, 0, 0), flush=True)
    process = _start(command, log_path)
    last_report = row_start
    try:
        while process.is_alive():
            process.join(0.5)
            if time.monotonic() - last_report >= REPORT_EVERY:
                state = _read_json(progress_file) or {}
                print(
                    progress.line(
                        index, row, row_start, state.get("step", 0), state.get("max_steps", 0)
                    ),
                    flush=True,
                )
                last_report = time.monotonic()
    except BaseException:
        process.terminate()
        process.join()
        raise
    return process.exitcode


def run_ablation(
    rows: list[Row],
    base: Path,
    overrides: list[str],
    out: Path,
    seeds: int = 1,
    cache: Path | None = None,
) -> list[str]:
    """Run the rows (each with ``seeds`` seeds; from the cache ``cache`` if given) not yet
    finished in ``out``, then write and print the tables.

    Returns:
        the names of the rows that failed.

    Raises:
        ValueError: if ``out`` holds rows run with another base config or other overrides
            (their numbers would not be comparable).
    """
    for folder in ("rows", "logs", "tensorboard"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    setup = {"base": str(base.resolve()), "overrides": list(overrides)}
    finished = {path.stem: _read_json(path) for path in sorted((out / "rows").glob("*.json"))}
    finished = {k: v for k, v in finished.items() if v is not None and "setup" in v}
    other = sorted(k for k, v in finished.items() if v["setup"] != setup)
    if other:
        raise ValueError(
            f"{out} holds rows {other} run with another base or overrides "
            f"({finished[other[0]]['setup']}); use another --out or remove {out / 'rows'}"
        )
    runs = [
        (Row(row.name, row.slug if seed == 0 else f"{row.slug}-seed{seed}", row.config), seed)
        for row in rows
        for seed in range(seeds)
    ]
    todo = [(row, seed) for row, seed in runs if row.slug not in finished]
    for row, _ in runs:
        if row.slug in finished:
            print(f"{row.name}: already done in {out / 'rows' / row.slug}.json, skipped")
    if cache is not None and todo:
        _write_cache(base, overrides, cache, out)

    progress = _Progress(len(todo))
    failed = []
    for index, (row, seed) in enumerate(todo, start=1):
        row_start = time.monotonic()
        data = []
        if cache is not None:
            data = ["--data", "radio_lit.cache.CachedViews", "--data.path", str(cache)]
        command = _fit_command(row, base, [*overrides, *_seed_overrides(seed), *data], out)
        status = _run_row(row, index, command, out, progress)
        metrics = _read_json(out / "rows" / f"{row.slug}.metrics.json")
        seconds = time.monotonic() - row_start
        log_path = out / "logs" / f"{row.slug}.log"
        if status != 0 or metrics is None:
            failed.append(row.name)
            print(f"[{index}/{len(todo)}] {row.name} FAILED (exit {status}), see {log_path}:")
            print(_tail(log_path), flush=True)
            continue
        progress.row_done(seconds, int(metrics["step"]))
        result = {
            "row": row.name,
            "seed": seed,
            "setup": setup,
            "config": str(row.config),
            "seconds": round(seconds, 1),
            "step": metrics["step"],
            "metrics": metrics["metrics"],
        }
        write_json(out / "rows" / f"{row.slug}.json", result)
        finished[row.slug] = result
        print(
            f"[{index}/{len(todo)}] {row.name}: done, {metrics['step']} steps in {_clock(seconds)}",
            flush=True,
        )
    _write_tables(finished, out)
    if failed:
        print(f"failed rows: {', '.join(failed)}", flush=True)
    return failed


def _write_tables(finished: dict[str, dict[str, Any]], out: Path) -> None:
    """``results.csv`` and one markdown file per table, rows in the paper's order."""
    order = {name: i for i, name in enumerate(ROWS)}
    results = sorted(finished.values(), key=lambda r: (order.get(r["row"], len(ROWS)), r["row"]))
    if not results:
        return
    by_row: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_row.setdefault(result["row"], []).append(result)
    metrics = {name: _mean_metrics(runs) for name, runs in by_row.items()}
    spreads = None
    if any(len(runs) > 1 for runs in by_row.values()):
        spreads = {name: _std_metrics(runs) for name, runs in by_row.items()}
    write_csv(
        out / "results.csv",
        {
            name: {
                "seeds": len(runs),
                "seconds": sum(r["seconds"] for r in runs),
                "step": runs[0]["step"],
                **metrics[name],
                **{f"{k} std": v for k, v in (spreads or {}).get(name, {}).items()},
            }
            for name, runs in by_row.items()
        },
    )
    text = []
    for key, table in all_tables(metrics, spreads).items():
        (out / f"{key}.md").write_text(table.markdown())
        text.append(table.markdown())
    print("\n" + "\n".join(text), flush=True)
    print(f"tables: {out}/*.md, all metrics: {out / 'results.csv'}", flush=True)


def _mean_metrics(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each metric's mean over a row's seeds (tags in the order the runs logged them, so the
    tables keep the config's teacher order)."""
    tags = dict.fromkeys(tag for run in runs for tag in run["metrics"])
    return {
        tag: statistics.fmean(run["metrics"][tag] for run in runs if tag in run["metrics"])
        for tag in tags
    }


def _std_metrics(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each metric's sample standard deviation over a row's seeds (0 for a single seed)."""
    tags = dict.fromkeys(tag for run in runs for tag in run["metrics"])
    spreads = {}
    for tag in tags:
        values = [run["metrics"][tag] for run in runs if tag in run["metrics"]]
        spreads[tag] = statistics.stdev(values) if len(values) > 1 else 0.0
    return spreads
