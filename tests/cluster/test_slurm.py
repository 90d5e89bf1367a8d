"""radio-lit under a real SLURM (one node on this machine, :mod:`tests.cluster.local_slurm`).

The job is ``launch/slurm/quickstart.sbatch`` as the README gives it (2 tasks, DDP over gloo
on CPU), with a tiny schedule on top and a DINOv2 teacher whose construction waits for the
test (:class:`tests.cli.pause.BuildsUntil`). It gets SLURM's warning signal (``scancel
--signal=USR1``) twice: first while both its tasks are still building that teacher, where it
requeues itself with nothing to save, then mid-run, where it saves, requeues itself and
resumes. It must end, in a single run folder, with the weights and statistics of the same
command run through without a signal: that reference runs beside the job, its 2 ranks forked
from the tests' fork server with the environment a launcher gives its ranks (tests/distributed;
two fresh interpreters fewer than a second job). [choice] One job covers both signals (two
fewer rank processes than a job for each).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import forking
from tests.cli.pause import building_teacher
from tests.cluster.local_slurm import LocalSlurm, missing_binaries
from tests.distributed.test_distributed_fit import _env, _free_port

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "launch" / "slurm" / "quickstart.sbatch"
STEPS = 8
SIGNAL_FROM = 4  # the preempted job is signalled once it reaches this step
JOB_TIMEOUT_S = 400

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        bool(missing_binaries()),
        reason=f"SLURM is not installed ({', '.join(missing_binaries())} missing; "
        "apt-get install slurm-wlm munge)",
    ),
]


def _config(folder: Path) -> Path:
    """A tiny schedule: statistics over steps 0-2, a frozen trunk over 0-3, one DataLoader
    worker, and no checkpoint before the last step but the one a signal writes; the DINOv2
    teacher is built once ``folder/go`` exists; steps from :data:`SIGNAL_FROM` on are slowed
    down (the window for the mid-run signal) until ``folder/resumed`` exists."""
    callbacks = [
        {
            "class_path": "radio_lit.callbacks.TeacherStatsEstimation",
            "init_args": {"steps": 3, "refit_every": 1},
        },
        {"class_path": "radio_lit.callbacks.FreezeBody", "init_args": {"steps": 4}},
        {"class_path": "radio_lit.callbacks.RandomStates"},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "save_top_k": 0, "every_n_train_steps": STEPS},
        },
        {
            "class_path": "tests.cluster.signals.SlowFrom",
            "init_args": {
                "step": SIGNAL_FROM,
                "flag": str(folder / "reached"),
                "seconds": 1.5,
                "until": str(folder / "resumed"),
            },
        },
    ]
    config = {
        "trainer": {
            "max_steps": STEPS,
            "log_every_n_steps": 1,
            "enable_model_summary": False,
            "callbacks": callbacks,
        },
        "model": {"teachers": {"dino": building_teacher(folder / "building", folder / "go")}},
        "data": {
            "init_args": {
                "val_dir": None,
                "repeats": 2,
                "batch_size": 1,  # 10 steps an epoch: the signal lands mid-epoch
                "crop_size": 96,
                "num_workers": 1,
            }
        },
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _job_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "configs").symlink_to(ROOT / "configs")  # the script's relative config path
    return folder


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    bin_dir = str(Path(sys.executable).parent)  # radio-lit of this environment
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    cluster.env.update(
        PATH=os.pathsep.join([bin_dir, os.environ["PATH"]]), PYTHONPATH=os.pathsep.join(paths)
    )
    yield cluster
    cluster.stop()


def _wait_for(slurm: LocalSlurm, job: str, folder: Path, *flags: str) -> None:
    """Wait until the job has created ``folder/<flag>`` for every flag."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not all((folder / flag).exists() for flag in flags):
        assert slurm.job(job).get("JobState") in ("PENDING", "RUNNING"), _output(folder, job)
        assert time.monotonic() < deadline, _output(folder, job)
        time.sleep(1)


def _start_requeued(slurm: LocalSlurm, job: str, before_start=None) -> None:
    """Wait until the signalled job is requeued (or has ended) and start it again now (a
    requeued job waits ~2 min to start), after ``before_start()``."""
    slurm.wait_state(job, ("PENDING", "REQUEUED", "COMPLETED", "FAILED"), 120)
    if slurm.job(job).get("JobState") != "COMPLETED":
        slurm.wait_state(job, ("PENDING",), 60)
        if before_start is not None:
            before_start()
        slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])


def _command() -> list[str]:
    """The ``radio-lit`` arguments of the script's ``srun`` line (its ``"$@"`` left out)."""
    line = next(x for x in SBATCH.read_text().splitlines() if x.startswith("srun "))
    words = shlex.split(line)
    return [w for w in words[words.index("radio-lit") + 1 :] if w != "$@"]


def _reference(folder: Path) -> list[forking.Forked]:
    """The job's command, run through by 2 ranks forked in ``folder`` (no SLURM, no signal)."""
    (folder / "go").touch()  # builds at once
    (folder / "resumed").touch()  # and is never slowed down: no signal to wait for
    argv = [*_command(), "--config", str(_config(folder))]
    port = _free_port()
    return [
        forking.start("radio_lit.cli.app:main", [argv], folder / f"rank{r}", _env(port, r), folder)
        for r in range(2)
    ]


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """``{"preempted": (job id, folder), "through": (None, folder)}``: the job, signalled
    twice, and the reference run beside it; waits for both."""
    root = tmp_path_factory.mktemp("jobs")
    folder = _job_folder(root, "preempted")
    job = slurm.sbatch(SBATCH, folder, args=["--config", str(_config(folder))])
    through = _job_folder(root, "through")
    reference = _reference(through)
    _wait_for(slurm, job, folder, "building-0", "building-1")  # both tasks building
    slurm.run(["scancel", "--signal=USR1", job])
    _start_requeued(slurm, job, before_start=(folder / "go").touch)
    _wait_for(slurm, job, folder, "reached")
    slurm.run(["scancel", "--signal=USR1", job])
    _start_requeued(slurm, job, before_start=(folder / "resumed").touch)  # not slowed down
    state = slurm.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), JOB_TIMEOUT_S)
    assert state == "COMPLETED", _output(folder, job)
    outcomes = [rank.wait(time.monotonic() + JOB_TIMEOUT_S) for rank in reference]
    for rank, outcome in enumerate(outcomes):
        assert outcome.exitcode == 0, f"reference rank {rank}:\n{outcome.stderr[-3000:]}"
    return {"preempted": (job, folder), "through": (None, through)}


def _output(folder: Path, job: str) -> str:
    """The job's whole output, every launch of it (``--open-mode=append``)."""
    out = folder / f"slurm-{job}.out"
    return out.read_text() if out.exists() else "(no output yet)"


def _run_folder(folder: Path, job: str | None) -> Path:
    """The only run folder the run wrote: ``lightning_logs/quickstart/job<id>`` for a job."""
    runs = sorted((folder / "lightning_logs" / "quickstart").iterdir())
    assert len(runs) == 1, runs
    assert job is None or runs[0].name == f"job{job}", runs
    return runs[0]


def _last(folder: Path, job: str | None) -> dict:
    return torch.load(_run_folder(folder, job) / "checkpoints" / "last.ckpt", map_location="cpu")


def test_a_two_task_sbatch_trains_into_one_run_folder(jobs):
    """Every launch of the job that trained (after the signal while building: two) logged
    from rank 0 only, into the one run folder, with its config.yaml."""
    job, folder = jobs["preempted"]
    run = _run_folder(folder, job)
    assert len(list(run.glob("events.out.tfevents.*"))) == 2, _output(folder, job)
    assert (run / "config.yaml").is_file()
    assert _last(folder, job)["global_step"] == STEPS


def test_a_preempted_job_requeues_resumes_and_ends_as_the_uninterrupted_one(slurm, jobs):
    job, folder = jobs["preempted"]
    output = _output(folder, job)
    assert int(slurm.job(job)["Restarts"]) == 2, output  # once while building, once mid-run
    assert "radio-lit: SIGUSR1 received: every rank stopped after" in output
    run = _run_folder(folder, job).relative_to(folder)
    assert f"Restored all states from the checkpoint at {run}/checkpoints/last-preempted.ckpt" in (
        output
    )
    resumed, through = _last(folder, job), _last(jobs["through"][1], None)
    assert resumed["global_step"] == through["global_step"] == STEPS
    state, reference = resumed["state_dict"], through["state_dict"]
    statistics = [k for k in reference if k.startswith("normalizers.")]
    assert statistics
    for key in statistics:
        assert torch.equal(state[key], reference[key]), key
    for key in [k for k in reference if k.startswith(("student.", "heads."))]:
        torch.testing.assert_close(state[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)


def test_a_job_signalled_while_it_builds_requeues_and_trains_to_the_end(slurm, jobs):
    """SLURM's ``USR1`` while both tasks build a teacher (was: "srun: error: tasks 0-1: User
    defined signal 1", the job FAILED): one line, the job requeued with nothing to save, and
    the requeued job trains (and, signalled again, resumes) to the end in the same run
    folder, from step 0: its first checkpoint is the one the mid-run signal writes."""
    job, folder = jobs["preempted"]
    output = _output(folder, job)
    assert "Traceback" not in output
    (line,) = [x for x in output.splitlines() if "received while the run was being built" in x]
    assert line.startswith("radio-lit: SIGUSR1 received"), line
    assert f"SLURM job {job} requeued" in line
    restored = [x for x in output.splitlines() if "Restored all states" in x]
    assert len(restored) == 1, restored  # only the launch after the mid-run signal resumes
    assert _last(folder, job)["global_step"] == STEPS  # _last: the one run folder
