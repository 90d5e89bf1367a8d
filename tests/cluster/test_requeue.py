"""``cluster.requeue`` against a ``scontrol`` that answers as SLURM's does, without a cluster.

Under a real SLURM (tests/cluster/test_slurm.py) both ranks of a job signalled while it builds
ask for the requeue; the first request makes SLURM send SIGTERM to every process of the job,
and that can end the other rank's ``scontrol`` before it answers (seen in CI: "SLURM did not
requeue job 1: scontrol exited -15" for a job that was requeued). Asked again, SLURM answers
"Job is pending execution for job N" (checked on this machine's slurm-wlm).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radio_lit.distributed import cluster


def _scontrol(folder: Path, monkeypatch, answers: list[str]) -> Path:
    """A ``scontrol`` on PATH whose n-th call runs ``answers[n]`` (shell); its calls are
    counted in ``folder/calls``."""
    calls = folder / "calls"
    cases = "\n".join(f"  {i}) {answer} ;;" for i, answer in enumerate(answers))
    script = folder / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {calls} 2>/dev/null || echo 0); echo $((n + 1)) > {calls}\n"
        f"case $n in\n{cases}\nesac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return calls


PENDING = 'echo "Job is pending execution for job 7" >&2; exit 1'


def test_a_scontrol_killed_by_another_ranks_requeue_is_asked_again(tmp_path, monkeypatch):
    calls = _scontrol(tmp_path, monkeypatch, ["kill -TERM $$", PENDING])
    assert cluster.requeue("7") is None
    assert calls.read_text().strip() == "2"


def test_a_refusal_after_the_second_ask_is_slurms_reason(tmp_path, monkeypatch):
    refused = 'echo "Requeue of job 7 not allowed: job is not batch" >&2; exit 1'
    _scontrol(tmp_path, monkeypatch, ["kill -TERM $$", refused])
    assert cluster.requeue("7") == "Requeue of job 7 not allowed: job is not batch"


def test_a_scontrol_killed_twice_says_so(tmp_path, monkeypatch):
    calls = _scontrol(tmp_path, monkeypatch, ["kill -TERM $$", "kill -KILL $$", PENDING])
    assert cluster.requeue("7") == "scontrol was ended by signal 9, twice"
    assert calls.read_text().strip() == "2"


@pytest.mark.parametrize(
    ("answer", "expected"), [("exit 0", None), (PENDING, None), ("exit 3", "scontrol exited 3")]
)
def test_scontrols_answer_is_taken_at_once(tmp_path, monkeypatch, answer, expected):
    calls = _scontrol(tmp_path, monkeypatch, [answer, "exit 0"])
    assert cluster.requeue("7") == expected
    assert calls.read_text().strip() == "1"
