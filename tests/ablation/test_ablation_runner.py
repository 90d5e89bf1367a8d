"""radio-lit ablate: options, resume, and one real end-to-end run of two rows."""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from pathlib import Path

import pytest

from radio_lit.ablation import FinalValidation, runner
from radio_lit.ablation.processes import Slot, job_slots
from radio_lit.ablation.progress import Progress, RowState
from radio_lit.ablation.rows import ROWS, resolve_rows
from radio_lit.cli.app import main
from tests.builders import cpu_trainer, image_batches, tiny_module

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "configs" / "ablations" / "base.yaml"
ROWS_DIR = ROOT / "configs" / "ablations"


def test_every_row_of_the_paper_has_a_config_and_names_are_forgiving():
    rows = resolve_rows(list(ROWS), ROWS_DIR)
    assert [r.name for r in rows] == list(ROWS)
    assert all(r.config.is_file() for r in rows)
    assert [r.name for r in resolve_rows(["hyb smL1", "phi-s", "HYB_MSE"], ROWS_DIR)] == [
        "Hyb SmL1",
        "PHI-S",
        "Hyb MSE",
    ]


def test_a_bad_row_or_base_is_one_clear_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["ablate", "--rows", "MSE", "PHIS", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown ablation row(s) ['PHIS']" in err and "PHI-S" in err
    with pytest.raises(SystemExit):
        main(["ablate", "--base", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)])
    assert f"--base {tmp_path / 'nope.yaml'}: no such config file" in capsys.readouterr().err
    assert not (tmp_path / "rows").exists()


def fake_row(args: list[str]) -> None:
    """A row's process that writes the file FinalValidation writes: ``[path, json, code]``."""
    path, metrics, exit_code = args
    Path(path).write_text(metrics)
    sys.exit(int(exit_code))


def _fake_fit(calls: list[str], exit_code: int = 0):
    """A stand-in for a row's fit (:func:`fake_row`)."""

    def command(row, base, overrides, out):
        calls.append(row.name)
        metrics = {"step": 3, "metrics": {"val/clip/mse": len(calls) / 10, "val/loss": 1.0}}
        path = out / "rows" / f"{row.slug}.metrics.json"
        args = [str(path), json.dumps(metrics), str(exit_code)]
        return runner.Command(f"{__name__}:fake_row", args)

    return command


def test_finished_rows_are_not_run_again(monkeypatch, tmp_path, capsys):
    rows = resolve_rows(["MSE", "PHI-S"], ROWS_DIR)
    overrides = ["--trainer.max_steps", "3"]
    calls: list[str] = []
    monkeypatch.setattr(runner, "_fit_command", _fake_fit(calls, exit_code=1))
    assert runner.run_ablation(rows[:1], BASE, overrides, tmp_path) == ["MSE"]
    assert not (tmp_path / "rows" / "mse.json").exists()  # a failed row is no result

    monkeypatch.setattr(runner, "_fit_command", _fake_fit(calls))
    assert runner.run_ablation(rows[:1], BASE, overrides, tmp_path) == []
    assert calls == ["MSE", "MSE"]
    capsys.readouterr()

    assert runner.run_ablation(rows, BASE, overrides, tmp_path) == []
    assert calls == ["MSE", "MSE", "PHI-S"]  # MSE was done: only PHI-S ran
    assert "MSE: already done" in capsys.readouterr().out
    result = json.loads((tmp_path / "rows" / "mse.json").read_text())
    assert result["metrics"]["val/clip/mse"] == pytest.approx(0.2)
    with (tmp_path / "results.csv").open() as handle:
        assert [r["row"] for r in csv.DictReader(handle)] == ["MSE", "PHI-S"]
    assert "| PHI-S | 0.3 |" in (tmp_path / "teacher_mse.md").read_text()

    assert runner.run_ablation(rows, BASE, overrides, tmp_path) == []
    assert calls == ["MSE", "MSE", "PHI-S"]
    with pytest.raises(ValueError, match="another base or overrides"):
        runner.run_ablation(rows, BASE, ["--trainer.max_steps", "4"], tmp_path)


@pytest.mark.slow
def test_ablate_two_rows_end_to_end_through_the_cli(tmp_path, capsys):
    out = tmp_path / "ablations"
    command = ["ablate", "--rows", "MSE", "PHI-S", "--out", str(out), "--trainer.max_steps", "4"]
    main(command)  # the rows run in processes of their own, forked from the fork server
    done = capsys.readouterr().out
    assert "[2/2] PHI-S: done, 4 steps" in done

    with (out / "results.csv").open() as handle:
        rows = {r["row"]: r for r in csv.DictReader(handle)}
    assert list(rows) == ["MSE", "PHI-S"]
    teachers = ["dfn_clip", "siglip", "dino_v2", "sam"]
    for row in rows.values():
        for teacher in teachers:
            assert float(row[f"val/{teacher}/mse"]) > 0
            assert float(row[f"val/{teacher}/fidelity"]) > 0
        assert float(row["val/fidelity_geomean"]) > 0
    # The unnormalized MSE baseline leaves the tiny-scale CLIP-like teacher unlearned.
    assert float(rows["PHI-S"]["val/dfn_clip/fidelity"]) > float(
        rows["MSE"]["val/dfn_clip/fidelity"]
    )
    for table in ("teacher_mse", "fidelity", "error_variance_range", "ranks"):
        assert "| PHI-S |" in (out / f"{table}.md").read_text()
    # the config's teacher order (DFN CLIP, SigLIP, DINOv2, SAM), as in the paper's tables
    assert "| Method | dfn_clip | siglip | dino_v2 | sam | GeoMean |" in done
    assert "### Fidelity" in done
    for slug in ("mse", "phi-s"):
        assert list((out / "tensorboard" / slug).glob("events.out.tfevents.*"))
        assert "max_steps=4` reached" in (out / "logs" / f"{slug}.log").read_text()

    main(command)
    again = capsys.readouterr().out
    assert "MSE: already done" in again and "PHI-S: already done" in again


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_final_validation_runs_at_the_last_step_and_saves_its_metrics(tmp_path):
    metrics_file = tmp_path / "metrics.json"
    trainer = cpu_trainer(tmp_path, max_steps=3, callbacks=[FinalValidation(str(metrics_file))])
    # An epoch is 10 steps: without the callback nothing would validate before step 10.
    trainer.fit(tiny_module(), image_batches(40, 4), image_batches(8, 4, seed=1))
    saved = json.loads(metrics_file.read_text())
    assert saved["step"] == 3
    assert {"val/clip/mse", "val/sam/fidelity", "val/fidelity_geomean"} <= set(saved["metrics"])

    no_validation = cpu_trainer(
        tmp_path, max_steps=2, callbacks=[FinalValidation(str(metrics_file))]
    )
    with pytest.raises(RuntimeError, match="no validation ran at the last training step"):
        no_validation.fit(tiny_module(), image_batches(40, 4))


def test_time_left_comes_from_measured_time_per_step() -> None:
    """Three rows of 100 steps, one at a time. Before any row has finished, the running row's
    rate since its first reported step (and its start-up time) predicts the rest; afterwards
    the finished rows' seconds per step do, whatever the running row's start-up looks like."""
    progress = Progress(total=3)
    # Row 1: 8 s of start-up, then 0.5 s per step; first report at step 4.
    row = RowState("MSE", 1, start=0.0, step=4, max_steps=100)
    assert progress.seconds_left([row], waiting=2, now=10.0) is None
    row.step = 24
    left = progress.seconds_left([row], waiting=2, now=20.0)
    assert left == pytest.approx(0.5 * 76 + 2 * (8.0 + 0.5 * 100))
    progress.row_done(1, seconds=60.0, steps=100)  # 0.6 s per step, all included
    # Row 2 at step 3 after 5 s: 55 s left in it, 60 s for row 3.
    row = RowState("PHI-S", 2, start=0.0, step=3, max_steps=100)
    assert progress.seconds_left([row], waiting=1, now=5.0) == pytest.approx(55.0 + 60.0)
    progress.row_done(2, seconds=60.0, steps=100)
    # The last row running past the finished rows' time: nothing left to estimate.
    row = RowState("ZCA", 3, start=0.0, step=100, max_steps=100)
    assert progress.seconds_left([row], waiting=0, now=70.0) == 0.0


def test_time_left_shares_the_rows_among_the_jobs() -> None:
    """Two jobs, 60 s rows: two running rows with 50 s and 20 s left and two rows waiting
    leave (50 + 20 + 2 x 60) / 2 s; one long row left alone sets the time."""
    progress = Progress(total=6, jobs=2)
    progress.row_done(1, seconds=60.0, steps=100)
    running = [RowState("A", 3, start=0.0, max_steps=100), RowState("B", 4, start=-30.0)]
    assert progress.seconds_left(running, waiting=2, now=10.0) == pytest.approx(95.0)
    assert progress.seconds_left(running[:1], waiting=0, now=10.0) == pytest.approx(50.0)


def test_jobs_share_the_cores_and_the_gpus():
    assert job_slots(1, cores=16, gpus=["0", "1"]) == [Slot()]  # torch's defaults
    assert job_slots(2, cores=2, gpus=[]) == [Slot(1), Slot(1)]
    assert job_slots(3, cores=16, gpus=[]) == [Slot(5)] * 3
    assert job_slots(2, cores=16, gpus=["0", "1", "2", "3"]) == [Slot(8, "0,1"), Slot(8, "2,3")]
    assert job_slots(4, cores=2, gpus=["4", "5", "6", "7"])[3] == Slot(1, "7")
    with pytest.raises(ValueError, match="--jobs 3 needs a GPU per job but 2 are visible"):
        job_slots(3, cores=16, gpus=["0", "1"])
    with pytest.raises(ValueError, match="--jobs must be at least 1"):
        job_slots(0, cores=2, gpus=[])


def waiting_row(args: list[str]) -> None:
    """A row's process that marks its start, waits (up to 60 s) for the other row's mark,
    then writes its metrics with the threads and GPUs it was given:
    ``[metrics path, my mark, other's mark]``."""
    path, mine, other = map(Path, args)
    mine.touch()
    deadline = time.monotonic() + 60
    while not other.exists():
        if time.monotonic() > deadline:
            sys.exit(3)  # the other row never ran beside this one
        time.sleep(0.05)
    import torch

    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = {"threads": torch.get_num_threads(), "gpus": gpus}
    path.write_text(json.dumps({"step": 3, "metrics": {"val/loss": 1.0}, "seen": seen}))


def test_jobs_run_rows_at_once_on_their_slots(monkeypatch, tmp_path, capsys):
    rows = resolve_rows(["MSE", "PHI-S"], ROWS_DIR)
    marks = {"MSE": tmp_path / "mse.mark", "PHI-S": tmp_path / "phi-s.mark"}

    def command(row, base, overrides, out):
        other = marks["PHI-S" if row.name == "MSE" else "MSE"]
        path = out / "rows" / f"{row.slug}.metrics.json"
        return runner.Command(
            f"{__name__}:waiting_row", [str(path), str(marks[row.name]), str(other)]
        )

    monkeypatch.setattr(runner, "_fit_command", command)
    slots = [Slot(1, "0"), Slot(1, "1")]
    assert runner.run_ablation(rows, BASE, [], tmp_path / "out", slots=slots) == []
    out = capsys.readouterr().out
    assert "[1/2] MSE: done" in out and "[2/2] PHI-S: done" in out
    seen = [
        json.loads((tmp_path / "out" / "rows" / f"{slug}.metrics.json").read_text())["seen"]
        for slug in ("mse", "phi-s")
    ]
    assert seen == [{"threads": 1, "gpus": "0"}, {"threads": 1, "gpus": "1"}]


def sleeping_row(args: list[str]) -> None:
    """A row's process that never finishes on its own."""
    time.sleep(120)


def test_an_interrupted_ablation_stops_its_rows_and_says_how_to_go_on(
    monkeypatch, tmp_path, capsys
):
    started = []

    def start(*args):
        started.append(real_start(*args))
        return started[-1]

    def interrupt(*args, **kwargs):  # Ctrl-C while the rows run
        raise KeyboardInterrupt

    real_start = runner.start
    monkeypatch.setattr(runner, "start", start)
    monkeypatch.setattr(runner, "wait", interrupt)
    sleeper = runner.Command(f"{__name__}:sleeping_row", [])
    monkeypatch.setattr(runner, "_fit_command", lambda *args: sleeper)
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["--rows", "MSE", "PHI-S", "ZCA", "--jobs", "2", "--out", str(tmp_path)])
    assert exit_info.value.code == 130
    assert len(started) == 2 and not any(process.is_alive() for process in started)
    err = capsys.readouterr().err
    assert "interrupted" in err and "run the same command to go on" in err
