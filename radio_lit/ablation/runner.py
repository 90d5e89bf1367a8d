"""``radio-lit ablate``: train every ablation row and write the PHI-S tables (or, with
``--row-set c-radio``, the C-RADIOv4 rows' tables).

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
    radio-lit ablate --jobs 2                          # two rows at once
    radio-lit ablate --row-set c-radio --seeds 3       # C-RADIOv4's parts, fixed-pattern teachers

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

Rows run one at a time by default. ``--jobs N`` runs N at once, each on its share of the
machine (:mod:`radio_lit.ablation.processes`: cores as torch threads, a block of the GPUs),
and writes the cache with N processes on disjoint shards. Small rows do not use a second core
(their kernels are too short to split), so on a 2-core CPU two rows at once take about the
time of one; rows and cache must share ``--jobs`` for a cached row to be bit-identical to its
live one.

``--row-set`` picks the rows, their folder, their base and their tables
(:data:`~radio_lit.ablation.rows.ROW_SETS`): ``phi-s`` (default, ``configs/ablations/``) or
``c-radio`` (``configs/ablations/c-radio/``: RADIOv2.5's losses, + the shift-equivariant dense
loss, + the angle-balanced summary loss, + MESA and DAMP, on toy teachers with fixed-pattern
noise; tables of the pattern share, the error against the clean teacher features, teacher MSE
and fidelity). The ``c-radio`` rows shift the teachers' views every step, so they run live:
``--cache`` is refused for them.

A row set may name :class:`~radio_lit.ablation.rows.Prerequisite` runs: ``c-radio``'s two
``High-res`` rows need a FeatSharp upsampler of their SigLIP2
(``configs/featsharp/ablation-c-radio.yaml``). Before the rows, the runner trains each one
their rows need once per seed (``--jobs`` at a time; the rows' overrides are not passed to it)
into ``OUT/tensorboard/<name>[-seed<k>]/``, keeps one already there, and passes its
``checkpoints/last.ckpt`` to those rows; a failed one stops the ablation, naming its log.

One ablation at a time writes in an ``--out`` folder: a second one started there while the
first runs is refused in one line (:mod:`radio_lit.ablation.out_lock`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from radio_lit.ablation.final_validation import write_json
from radio_lit.ablation.out_lock import holding
from radio_lit.ablation.processes import Command, Slot, job_slots, start, visible_gpus
from radio_lit.ablation.progress import Progress, RowState, clock
from radio_lit.ablation.rows import ROW_SETS, Prerequisite, Row, RowSet, resolve_rows
from radio_lit.ablation.tables import all_tables, write_csv
from radio_lit.core.errors import CommandParser
from radio_lit.core.yaml_files import config_files, read_mapping

__all__ = ["main", "run_ablation"]

#: Seconds between two progress reports of the running rows.
REPORT_EVERY = 20.0


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="radio-lit ablate",
        description=(
            "Train the PHI-S ablation rows (tables 1 and 12), --jobs at a time, and write the "
            "paper's tables (teacher MSE, fidelity, error-variance ranges, mean ranks); or, "
            "with --row-set c-radio, C-RADIOv4's training parts and their fixed-pattern "
            "tables. Any other --section.key value option is passed to every row's radio-lit fit."
        ),
    )
    parser.add_argument(
        "--row-set",
        choices=list(ROW_SETS),
        default="phi-s",
        help="; ".join(f"{s.name}: {s.title} ({', '.join(s.rows)})" for s in ROW_SETS.values())
        + " (default: %(default)s)",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=None,
        metavar="ROW",
        help="rows to run, by name or file name (default: all of the row set)",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="base config every row overrides (default: the row set's small-scale CPU base, "
        "base.yaml in its folder)",
    )
    parser.add_argument(
        "--rows-dir",
        type=Path,
        default=None,
        help="folder of the rows' override configs (default: the row set's folder, "
        "configs/ablations or configs/ablations/c-radio)",
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
        "--jobs",
        type=int,
        default=1,
        help="rows trained at once, each on cores/jobs torch threads and its own GPUs if any; "
        "the cache is written by as many processes (default 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder: logs, TensorBoard runs, results, tables (default: "
        + ", ".join(f"{s.out} for {s.name}" for s in ROW_SETS.values())
        + ")",
    )
    return parser


def main(argv: Sequence[str]) -> None:
    """Entry point of ``radio-lit ablate``; exits with status 1 if a row failed."""
    parser = _parser()
    args, overrides = parser.parse_with_overrides(argv)
    row_set = ROW_SETS[args.row_set]
    base = args.base or row_set.directory() / "base.yaml"
    out = args.out or Path(row_set.out)
    if not base.is_file():
        parser.error(f"--base {base}: no such config file")
    try:
        rows = resolve_rows(
            args.rows or list(row_set.rows), args.rows_dir or row_set.directory(), row_set.rows
        )
    except ValueError as err:
        parser.error(f"--rows: {err}")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    for given in config_files(overrides):  # every row reads them: said once, before any
        read_mapping(Path(given), "--config")
    if args.cache is not None and not row_set.cacheable:
        parser.error(
            f"--cache: the {row_set.name} rows shift the teachers' views every step "
            "(model.shifts), which a cache of unshifted views cannot hold; drop --cache "
            "(they run their teachers live)"
        )
    try:
        gpus = visible_gpus() if args.jobs > 1 else []
        slots = job_slots(args.jobs, len(os.sched_getaffinity(0)), gpus)
        with holding(out):  # one ablation at a time in --out (radio_lit.ablation.out_lock)
            failed = run_ablation(
                rows, base, overrides, out, args.seeds, args.cache, slots, row_set
            )
    except ValueError as err:
        parser.error(str(err))
    except KeyboardInterrupt:
        print(
            f"radio-lit ablate: interrupted; the running rows were stopped and the finished "
            f"ones are kept in {out / 'rows'}: run the same command to go on",
            file=sys.stderr,
        )
        sys.exit(130)
    if failed:
        sys.exit(1)


def _seed_overrides(seed: int) -> list[str]:
    """Seed 0 is the base's own ``seed_everything``."""
    return [] if seed == 0 else ["--seed_everything", str(seed)]


def _write_cache(
    base: Path, overrides: list[str], folder: Path, out: Path, slots: list[Slot]
) -> None:
    """``radio-lit cache`` for the base (the rows share its teachers and data), one process per
    slot, each writing its own shards."""
    args = ["cache", "--config", str(base), *overrides]
    args += ["--out", str(folder), "--views", "epochs", "--num-shards", str(len(slots))]
    begin = time.monotonic()
    print(f"cache: writing the teachers' outputs to {folder}", flush=True)
    logs = [
        out / "logs" / ("cache.log" if len(slots) == 1 else f"cache-{k}.log")
        for k in range(len(slots))
    ]
    processes = [
        start(Command("radio_lit.cli.app:main", [*args, "--shard-index", str(k)]), log, slot)
        for k, (slot, log) in enumerate(zip(slots, logs, strict=True))
    ]
    try:
        for process in processes:
            process.join()
    except BaseException:
        _stop(processes)
        raise
    for process, log in zip(processes, logs, strict=True):
        if process.exitcode != 0:
            raise ValueError(
                f"radio-lit cache failed (exit {process.exitcode}), see {log}:\n{_tail(log)}"
            )
    print(f"cache: ready in {clock(time.monotonic() - begin)}", flush=True)


def _stop(processes: Sequence[Any]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.join()


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
    return Command("radio_lit.cli.app:main", args)


def _prerequisites(todo: list[tuple[Row, int]], row_set: RowSet) -> list[tuple[Prerequisite, int]]:
    """The ``(prerequisite, seed)`` runs the rows to run need, each once, in the rows' order."""
    needed = (
        (prerequisite, seed)
        for row, seed in todo
        for prerequisite in row_set.prerequisites
        if row.name in prerequisite.rows
    )
    return list(dict.fromkeys(needed))


def _prerequisite_options(row: Row, seed: int, row_set: RowSet, out: Path) -> list[str]:
    """The options that hand a row the checkpoints of its prerequisites for ``seed``."""
    options = []
    for prerequisite in row_set.prerequisites:
        if row.name in prerequisite.rows:
            options += [prerequisite.option, str(prerequisite.checkpoint(out, seed))]
    return options


def _prerequisite_command(prerequisite: Prerequisite, seed: int, out: Path) -> Command:
    """The prerequisite's ``radio-lit fit`` for ``seed``: its config, with its TensorBoard run
    (and so its checkpoints) in ``OUT/tensorboard/<name>[-seed<k>]``."""
    logger = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {
            "save_dir": str(out),
            "name": "tensorboard",
            "version": prerequisite.run_name(seed),
        },
    }
    args = ["fit", "--config", str(prerequisite.path()), *_seed_overrides(seed)]
    return Command("radio_lit.cli.app:main", [*args, "--trainer.logger", json.dumps(logger)])


def _train_prerequisites(
    needed: list[tuple[Prerequisite, int]], out: Path, slots: list[Slot]
) -> None:
    """Train the prerequisite runs whose checkpoint ``out`` does not hold yet, as many at once
    as there are ``slots``.

    Raises:
        ValueError: naming a run that failed (or saved no checkpoint) and its log's end.
    """
    todo = []
    for prerequisite, seed in needed:
        checkpoint = prerequisite.checkpoint(out, seed)
        if checkpoint.is_file():
            print(f"{prerequisite.run_name(seed)}: already trained, {checkpoint}", flush=True)
        else:
            todo.append((prerequisite, seed))
    for first in range(0, len(todo), len(slots)):
        runs = []
        for (prerequisite, seed), slot in zip(
            todo[first : first + len(slots)], slots, strict=False
        ):
            name = prerequisite.run_name(seed)
            for stale in (out / "tensorboard" / name).glob("events.out.tfevents.*"):
                stale.unlink()  # a failed earlier attempt: its logs start afresh
            log = out / "logs" / f"{name}.log"
            print(
                f"{name}: training {prerequisite.config} first, for the rows "
                f"{', '.join(prerequisite.rows)}",
                flush=True,
            )
            command = _prerequisite_command(prerequisite, seed, out)
            runs.append((prerequisite, seed, log, time.monotonic(), start(command, log, slot)))
        try:
            for *_, process in runs:
                process.join()
        except BaseException:
            _stop([process for *_, process in runs])
            raise
        for prerequisite, seed, log, begin, process in runs:
            name = prerequisite.run_name(seed)
            if process.exitcode != 0 or not prerequisite.checkpoint(out, seed).is_file():
                raise ValueError(
                    f"{name} ({prerequisite.config}, which the rows "
                    f"{', '.join(prerequisite.rows)} need) failed (exit {process.exitcode}), "
                    f"see {log}:\n{_tail(log)}"
                )
            print(f"{name}: ready in {clock(time.monotonic() - begin)}", flush=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join("    " + line for line in text[-lines:])


def run_ablation(
    rows: list[Row],
    base: Path,
    overrides: list[str],
    out: Path,
    seeds: int = 1,
    cache: Path | None = None,
    slots: list[Slot] | None = None,
    row_set: RowSet = ROW_SETS["phi-s"],
) -> list[str]:
    """Run the rows (each with ``seeds`` seeds; from the cache ``cache`` if given) not yet
    finished in ``out``, as many at once as there are ``slots`` (default: one, on the whole
    machine), then write and print the tables of ``row_set`` (default: PHI-S's).

    Returns:
        the names of the rows that failed.

    Raises:
        ValueError: if ``out`` holds rows run with another base config or other overrides
            (their numbers would not be comparable).
    """
    slots = slots or [Slot()]
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
        _write_cache(base, overrides, cache, out, slots)
    data = (
        []
        if cache is None
        else ["--data", "radio_lit.cache.CachedViews", "--data.path", str(cache)]
    )
    needed = _prerequisites(todo, row_set)
    _train_prerequisites(needed, out, slots)
    commands = [
        _fit_command(
            row,
            base,
            [
                *overrides,
                *_seed_overrides(seed),
                *data,
                *_prerequisite_options(row, seed, row_set, out),
            ],
            out,
        )
        for row, seed in todo
    ]
    results = _RowRunner([row for row, _ in todo], commands, out, slots).run()
    failed = []
    for (row, seed), (seconds, metrics) in zip(todo, results, strict=True):
        if metrics is None:
            failed.append(row.name)
            continue
        finished[row.slug] = {
            "row": row.name,
            "seed": seed,
            "setup": setup,
            "config": str(row.config),
            "seconds": round(seconds, 1),
            "step": metrics["step"],
            "metrics": metrics["metrics"],
        }
        write_json(out / "rows" / f"{row.slug}.json", finished[row.slug])
    _write_tables(finished, out, row_set)
    if failed:
        print(f"failed rows: {', '.join(failed)}", flush=True)
    return failed


@dataclass
class _Running:
    """A row's process and what its progress lines show."""

    number: int  # its place in the runner's list
    process: Any
    state: RowState


class _RowRunner:
    """Runs the rows' fits ``len(slots)`` at a time, each on a free slot, printing when each
    starts and ends and, every :data:`REPORT_EVERY` seconds, each running row's step and the
    time left."""

    def __init__(
        self, rows: list[Row], commands: list[Command], out: Path, slots: list[Slot]
    ) -> None:
        self.rows = rows
        self.commands = commands
        self.out = out
        self.slots = slots
        self.progress = Progress(len(rows), len(slots))
        self.results: list[tuple[float, dict[str, Any] | None]] = [(0.0, None)] * len(rows)

    def run(self) -> list[tuple[float, dict[str, Any] | None]]:
        """Each row's ``(seconds, final metrics)``, in the rows' order; ``None`` metrics for a
        row that failed."""
        waiting = list(range(len(self.rows)))
        running: dict[int, _Running] = {}  # slot number -> its row
        last_report = time.monotonic()
        try:
            while waiting or running:
                for slot, resources in enumerate(self.slots):
                    if slot not in running and waiting:
                        running[slot] = self._start(waiting.pop(0), resources, running, waiting)
                wait([r.process.sentinel for r in running.values()], timeout=0.5)
                for slot, job in list(running.items()):
                    if job.process.exitcode is not None:
                        del running[slot]
                        self._finish(job)
                if time.monotonic() - last_report >= REPORT_EVERY:
                    self._report(list(running.values()), len(waiting))
                    last_report = time.monotonic()
        except BaseException:
            _stop([job.process for job in running.values()])
            raise
        return self.results

    def _start(
        self, number: int, slot: Slot, running: dict[int, _Running], waiting: list[int]
    ) -> _Running:
        row = self.rows[number]
        rows_dir = self.out / "rows"
        for stale in (
            rows_dir / f"{row.slug}.progress.json",
            rows_dir / f"{row.slug}.metrics.json",
        ):
            stale.unlink(missing_ok=True)
        log_dir = self.out / "tensorboard" / row.slug
        if log_dir.is_dir():  # a failed earlier attempt: start its logs afresh
            for event_file in log_dir.glob("events.out.tfevents.*"):
                event_file.unlink()
        state = RowState(row.name, number + 1, time.monotonic())
        states = [job.state for job in running.values()] + [state]
        print(self.progress.line(state, states, len(waiting)), flush=True)
        process = start(self.commands[number], self._log(number), slot)
        return _Running(number, process, state)

    def _log(self, number: int) -> Path:
        return self.out / "logs" / f"{self.rows[number].slug}.log"

    def _finish(self, job: _Running) -> None:
        row, state = self.rows[job.number], job.state
        seconds = time.monotonic() - state.start
        status = job.process.exitcode
        metrics = _read_json(self.out / "rows" / f"{row.slug}.metrics.json")
        head = f"[{state.index}/{self.progress.total}] {row.name}"
        if status != 0 or metrics is None:
            print(f"{head} FAILED (exit {status}), see {self._log(job.number)}:")
            print(_tail(self._log(job.number)), flush=True)
            return
        self.results[job.number] = (seconds, metrics)
        self.progress.row_done(state.index, seconds, int(metrics["step"]))
        print(f"{head}: done, {metrics['step']} steps in {clock(seconds)}", flush=True)

    def _report(self, running: list[_Running], waiting: int) -> None:
        for job in running:
            report = _read_json(self.out / "rows" / f"{self.rows[job.number].slug}.progress.json")
            job.state.step = (report or {}).get("step", 0)
            job.state.max_steps = (report or {}).get("max_steps", 0)
        states = [job.state for job in running]
        for state in states:
            print(self.progress.line(state, states, waiting), flush=True)


def _write_tables(finished: dict[str, dict[str, Any]], out: Path, row_set: RowSet) -> None:
    """``results.csv`` and one markdown file per table, rows in the row set's order."""
    order = {name: i for i, name in enumerate(row_set.rows)}
    last = len(row_set.rows)
    results = sorted(finished.values(), key=lambda r: (order.get(r["row"], last), r["row"]))
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
    for key, table in all_tables(metrics, spreads, row_set.tables, row_set.ranks).items():
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
