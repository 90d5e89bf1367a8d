"""A stop signal that lands on one rank only, or on each rank at another step, in the middle
of the student's forward (where a handler that saved would wait for the other rank inside
DDP's gradient all-reduce): both ranks of a real ``radio-lit fit`` on 2 gloo processes stop
after the same step, write one checkpoint, and exit with the same status.

The ranks are forked from the tests' fork server with ``LOCAL_RANK`` set, as torchrun or SLURM
start them (tests/distributed); the two runs start together.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import forking
from tests.cli.test_resume import QUICKSTART, write_config
from tests.distributed.test_distributed_fit import _env, _free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT_S = 300
#: case -> the signals sent: (rank, step, signal), and the signal all ranks stop on
CASES = {
    "one-rank": ([(1, 2, signal.SIGUSR1)], signal.SIGUSR1),
    "each-rank-another-step": ([(0, 2, signal.SIGINT), (1, 3, signal.SIGTERM)], signal.SIGINT),
}
#: a rank killed mid-forward (SIGKILL: nothing is saved)
KILLED = [(1, 2, signal.SIGKILL)]


def _start(folder: Path, sends: list[tuple[int, int, int]]) -> list[forking.Forked]:
    config = yaml.safe_load(write_config(folder).read_text())
    callbacks = config["trainer"]["callbacks"]
    callbacks[-1]["init_args"]["every_n_train_steps"] = 100  # only the signal's checkpoint
    for rank, step, signum in sends:
        callbacks.append(
            {
                "class_path": "tests.cluster.signals.SignalAt",
                "init_args": {"rank": rank, "step": step, "signum": int(signum)},
            }
        )
    config["data"]["init_args"]["num_workers"] = 1
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    argv = ["fit", "--config", QUICKSTART, "--config", str(folder / "run.yaml")]
    argv += ["--trainer.devices", "2", "--trainer.strategy", "ddp"]
    port = _free_port()
    return [
        forking.start("radio_lit.cli.app:main", [argv], folder / f"rank{r}", _env(port, r))
        for r in range(2)
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{case: (folder, [outcome of each rank])}``; both cases run at once."""
    started = {}
    for case, sends in {**{c: s for c, (s, _) in CASES.items()}, "killed": KILLED}.items():
        folder = tmp_path_factory.mktemp(case)
        started[case] = (folder, _start(folder, sends))
    deadline = time.monotonic() + TIMEOUT_S
    return {
        case: (folder, [rank.wait(deadline) for rank in ranks])
        for case, (folder, ranks) in started.items()
    }


@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_stops_after_the_same_step(runs, case):
    folder, outcomes = runs[case]
    sends, stop_signal = CASES[case]
    logs = "\n".join(f"--- rank {r}\n{o.stderr[-3000:]}" for r, o in enumerate(outcomes))
    assert [o.exitcode for o in outcomes] == [128 + stop_signal] * 2, logs
    first = min(step for _, step, _ in sends)
    saved = torch.load(folder / "checkpoints" / "last-preempted.ckpt", weights_only=True)
    assert saved["global_step"] == first + 1  # the step the signal landed in completed
    assert f"every rank stopped after {first + 1} steps" in outcomes[0].stderr
    assert "resume with: radio-lit fit" in outcomes[0].stderr
    assert "Traceback" not in logs


def test_a_killed_rank_stops_the_other_with_one_line(runs):
    """Rank 1 SIGKILLed in the middle of a step: rank 0, waiting for it in DDP's gradient
    all-reduce, exits with status 1 and one line naming itself, not a traceback or a hang."""
    folder, (rank0, rank1) = runs["killed"]
    assert rank1.exitcode == -signal.SIGKILL
    assert rank0.exitcode == 1, rank0.stderr[-3000:]
    assert "Traceback" not in rank0.stderr
    (line,) = [x for x in rank0.stderr.splitlines() if x.startswith("radio-lit: error:")]
    assert "rank 0 of 2: another rank of this run stopped (" in line
