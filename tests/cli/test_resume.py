"""Exact resume, the way a user meets it: SIGKILL a real ``radio-lit fit`` and resume it.

The runs are ``radio_lit.cli.app.main`` (the console script) in processes forked from the tests'
fork server (:mod:`tests.forking`), each in a session of its own so that SIGKILL reaches its
DataLoader workers too.

A quickstart-shaped run (the quickstart's tiny CLIP, DINOv2 and SAM teachers and student, the
shipped photographs with random crops, 2 DataLoader workers, PHI-S statistics estimated over
the first steps, a frozen trunk, a checkpoint after every step) is killed with SIGKILL while
it estimates the teacher statistics, or later while the trunk is frozen, and resumed with
``--ckpt_path`` on its last checkpoint. It must end with the normalizer statistics and the
student weights of a run that was never interrupted: same data order, same crops, same CPE
windows across the resume, and epoch boundaries in between.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import forking

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
STEPS = 10  # 10 photographs, batches of 4: 2 batches an epoch, so 5 epochs
ESTIMATION = 4  # statistics estimated over steps 0-3
FROZEN = 7  # trunk frozen over steps 0-6


def resumable_callbacks(run_dir: Path, pause_at: int | None = None) -> list[dict]:
    """RandomStates, a checkpoint after every step and, with ``pause_at``, a pause before that
    step (where a test kills the run): the callbacks of a run that is killed and resumed."""
    callbacks = [
        {"class_path": "radio_lit.callbacks.RandomStates"},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {
                "dirpath": str(run_dir / "checkpoints"),
                "save_last": True,
                "save_top_k": 0,
                "every_n_train_steps": 1,
            },
        },
    ]
    if pause_at is not None:
        callbacks.append(
            {
                "class_path": "tests.cli.pause.PauseAt",
                "init_args": {"step": pause_at, "flag": str(run_dir / "paused")},
            }
        )
    return callbacks


def run_overlay(
    run_dir: Path,
    callbacks: list[dict],
    data: dict,
    steps: int,
    pause_at: int | None = None,
    name: str = "run.yaml",
) -> Path:
    """An overlay config in ``run_dir``: ``steps`` steps, no logger, ``callbacks`` then the
    resumable ones (a checkpoint after every step; paused at ``pause_at``), ``data``'s
    ``init_args``."""
    config = {
        "trainer": {
            "max_steps": steps,
            "logger": False,
            "default_root_dir": str(run_dir),
            "enable_model_summary": False,
            "callbacks": [*callbacks, *resumable_callbacks(run_dir, pause_at)],
        },
        "data": {"init_args": data},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
    path.write_text(yaml.safe_dump(config))
    return path


def write_config(run_dir: Path, pause_at: int | None = None) -> Path:
    """The quickstart with a tiny schedule, a checkpoint after every step, 2 workers."""
    callbacks = [
        {
            "class_path": "radio_lit.callbacks.TeacherStatsEstimation",
            "init_args": {"steps": ESTIMATION, "refit_every": 2},
        },
        {"class_path": "radio_lit.callbacks.FreezeBody", "init_args": {"steps": FROZEN}},
        {"class_path": "radio_lit.callbacks.NonFiniteGuard"},
    ]
    data = {"val_dir": None, "repeats": 1, "batch_size": 4, "crop_size": 96, "num_workers": 2}
    return run_overlay(run_dir, callbacks, data, STEPS, pause_at)


def argv(config: Path, *extra: str) -> list[str]:
    """``radio-lit``'s arguments for the quickstart with ``config`` on top."""
    return ["fit", "--config", QUICKSTART, "--config", str(config), *extra]


def fit(run_dir: Path, *extra: str) -> dict:
    config = run_dir / "run.yaml" if (run_dir / "run.yaml").exists() else write_config(run_dir)
    result = forking.run("radio_lit.cli.app:main", [argv(config, *extra)], run_dir / "fit", 600)
    assert result.exitcode == 0, result.stderr[-4000:]
    assert "not resumable" not in result.stderr
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


def start_killable(run_dir: Path, step: int) -> forking.Forked:
    """Start a run that pauses before ``step`` (in a session of its own: SIGKILL to its
    process group reaches its DataLoader workers too)."""
    config = write_config(run_dir, pause_at=step)
    return forking.start(
        "radio_lit.cli.app:main", [argv(config)], run_dir / "killed", new_session=True
    )


def kill_when_paused(run_dir: Path, run: forking.Forked, step: int) -> Path:
    """SIGKILL ``run`` when it reaches ``step``; its last checkpoint."""
    deadline = time.monotonic() + 600
    while not (run_dir / "paused").exists():
        assert run.alive(), run.err.read_text()[-4000:]
        assert time.monotonic() < deadline, "the run never reached the kill step"
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGKILL)  # the run and its DataLoader workers
    assert run.wait(time.monotonic() + 60).exitcode == -signal.SIGKILL
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == step
    # the resumed run is a fresh job: same config, without the pause
    write_config(run_dir)
    return last


KILL_STEPS = (3, 5)  # during the statistics estimation, while the trunk is frozen


@pytest.fixture(scope="module")
def killable(tmp_path_factory):
    """``{step: (run folder, run)}``: the runs to kill, started together; the tests ask for
    this fixture before :func:`uninterrupted`, so the uninterrupted run trains alongside them
    (three processes keep both cores busy)."""
    runs = {}
    for step in KILL_STEPS:
        run_dir = tmp_path_factory.mktemp(f"killed_at_{step}")
        runs[step] = (run_dir, start_killable(run_dir, step))
    yield runs
    for _, run in runs.values():  # after a failure: no run left paused
        if run.alive():
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(time.monotonic() + 60)


@pytest.fixture(scope="module")
def uninterrupted_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    fit(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_dir):
    return torch.load(uninterrupted_dir / "checkpoints" / "last.ckpt", weights_only=True)


def assert_same_run(resumed: dict, uninterrupted: dict) -> None:
    assert resumed["global_step"] == uninterrupted["global_step"] == STEPS
    statistics = [k for k in uninterrupted["state_dict"] if k.startswith("normalizers.")]
    assert statistics
    for key in statistics:
        assert torch.equal(resumed["state_dict"][key], uninterrupted["state_dict"][key]), key
    weights = [k for k in uninterrupted["state_dict"] if k.startswith(("student.", "heads."))]
    for key in weights:
        torch.testing.assert_close(
            resumed["state_dict"][key],
            uninterrupted["state_dict"][key],
            rtol=1e-5,
            atol=1e-6,
            msg=key,
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at",
    [pytest.param(3, id="during-statistics-estimation"), pytest.param(5, id="during-frozen-trunk")],
)
def test_a_killed_run_resumes_exactly(killable, uninterrupted, kill_at):
    assert kill_at < ESTIMATION or ESTIMATION <= kill_at < FROZEN
    run_dir, run = killable[kill_at]
    last = kill_when_paused(run_dir, run, kill_at)
    resumed = fit(run_dir, "--ckpt_path", str(last))
    assert_same_run(resumed, uninterrupted)


@pytest.mark.slow
def test_resuming_with_another_spectral_reparam_version_is_one_line(uninterrupted_dir, tmp_path):
    """A checkpoint of σReparam version 1 resumed by a version-2 student: exit 2, one line that
    names the option to set, no traceback."""
    last = uninterrupted_dir / "checkpoints" / "last.ckpt"
    extra = ["--ckpt_path", str(last), "--model.student.init_args.spectral_reparam_version", "2"]
    result = forking.run("radio_lit.cli.app:main", [argv(write_config(tmp_path), *extra)], tmp_path)
    assert result.exitcode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if "radio-lit: error:" in line]
    assert "--ckpt_path" in error
    assert "set model.student.init_args.spectral_reparam_version: 1" in error


@pytest.mark.slow
def test_a_checkpoint_of_another_model_leaves_every_run_folder_as_it_was(
    uninterrupted_dir, tmp_path
):
    """``--ckpt_path`` with a checkpoint the configured student cannot load (2 blocks, not 4),
    through the real CLI, refused in one line (exit 2) that names the command with the
    checkpoint's own run config; a new run leaves no folder (was: an empty ``version_N`` with
    config.yaml, events, checkpoints/), and the run it would have continued keeps its files
    and its config.yaml (was: the refused config written over it, and an event file whose
    ``purge_step`` hides the run's later steps in TensorBoard)."""
    last = uninterrupted_dir / "checkpoints" / "last.ckpt"
    run = tmp_path / "continued" / "quickstart" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(last, run / "checkpoints" / "last.ckpt")
    (run / "config.yaml").write_text("# the run's own config\n")
    (run / "events.out.tfevents.1.host.1.0").write_bytes(b"events")
    files = sorted(run.rglob("*"))
    smaller = ["--model.student.init_args.model_kwargs", "{depth: 2, embed_dim: 96, num_heads: 3}"]
    cases = {"new": last, "continued": run / "checkpoints" / "last.ckpt"}
    started = {
        case: forking.start(
            "radio_lit.cli.app:main",
            [
                ["fit", "--config", QUICKSTART, *smaller, "--ckpt_path", str(checkpoint)]
                + ["--trainer.logger.init_args.save_dir", str(tmp_path / case)]
            ],
            tmp_path / f"{case}-out",
        )
        for case, checkpoint in cases.items()
    }
    for case, forked in started.items():
        outcome = forked.wait(time.monotonic() + 600)
        assert outcome.exitcode == 2, outcome.stderr[-3000:]
        assert "Traceback" not in outcome.stderr
        (line,) = [x for x in outcome.stderr.splitlines() if x.startswith("radio-lit: error:")]
        assert "--ckpt_path: the checkpoint does not fit the configured model" in line
        config = cases[case].parent.parent / "config.yaml"
        assert config.is_file()
        assert f"radio-lit fit --config {config} --ckpt_path {cases[case]})" in line
    assert not (tmp_path / "new").exists() or not list((tmp_path / "new").rglob("version_*"))
    assert sorted(run.rglob("*")) == files
    assert (run / "config.yaml").read_text() == "# the run's own config\n"


@pytest.mark.slow
def test_a_sigterm_saves_says_how_to_resume_and_the_command_resumes_exactly(
    uninterrupted, tmp_path
):
    """``SIGTERM`` (a scheduler's stop) in the middle of step 3's forward, the last of an
    epoch, sent to the run and its two DataLoader workers at once, as SLURM signals every
    process of a job step on preemption: the run saves after that step (the next run starts
    a new epoch), names its folder and the command that resumes, and exits 143 (so that
    ``fit && next`` stops), without Lightning's "``weights_only`` was not set" note; the
    printed command ends as the uninterrupted run does, without a warning that its checkpoint
    folder is not empty, and drops ``last-preempted.ckpt`` once it has saved past it."""
    config = yaml.safe_load(write_config(tmp_path).read_text())
    for callback in config["trainer"]["callbacks"]:  # Lightning warns of a full folder then
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"]["save_top_k"] = 1
    config["trainer"]["callbacks"].append(
        {
            "class_path": "tests.cluster.signals.SignalAt",
            "init_args": {"rank": 0, "step": 3, "signum": int(signal.SIGTERM), "group": True},
        }
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    stopped = forking.run(
        "radio_lit.cli.app:main", [argv(tmp_path / "run.yaml")], tmp_path / "term", new_session=True
    )
    assert stopped.exitcode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
    assert "Traceback" not in stopped.stderr
    assert "weights_only" not in stopped.stderr
    (command,) = [x for x in stopped.stderr.splitlines() if x.startswith("resume with: ")]
    args = shlex.split(command.removeprefix("resume with: "))
    checkpoint = tmp_path / "checkpoints" / "last-preempted.ckpt"
    assert args[0] == "radio-lit" and args[-2:] == ["--ckpt_path", str(checkpoint)]
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 4  # 2 batches an epoch
    resumed = forking.run("radio_lit.cli.app:main", [args[1:]], tmp_path / "resumed", 600)
    assert resumed.exitcode == 0, resumed.stderr[-4000:]
    assert_same_run(torch.load(tmp_path / "checkpoints" / "last.ckpt"), uninterrupted)
    assert "exists and is not empty" not in resumed.stderr
    assert not checkpoint.exists()  # last.ckpt of a later step supersedes it
