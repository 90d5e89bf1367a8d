"""``radio-lit plan`` against real Lightning fits on this CPU, on one process and on two (gloo):
step time per rank within 25 % on both, memory per rank within 15 % on one (issue 50's "done
when"; on two processes a rank's measured peak moved by up to a gathered student between
runs of one config, 0.81-1.01x of the plan for FSDP2: docs/cost.md, not asserted).

Two recipes at CPU sizes (``benchmarks/gpu_check.py``'s ``--device cpu`` build: tiny
teachers, the CPU student, float32), each under its own strategy: AM-RADIO stage 2 (DDP,
two partitions: on two processes one partition a rank) and stage 1 (FSDP2: on two processes
each rank holds half the student, its gradients and optimizer state). Each fit runs in
processes of its own (``tests/planning/cpu_fit.py``) and is planned with the same overrides at
``--gpus`` its processes, ``--step 1`` (the fit's peak is in a step after the first, with the
earlier step's gradients and the optimizer state) and a calibration of this CPU written by
``radio-lit plan --calibrate --quick`` (none of these configs runs in it: its reference step
is a one-teacher distillation of its own, ``radio_lit/planning/calibrate.py``).

- memory: the tensors made before the fit still alive in its step 1 (teachers, buffers;
  FSDP2 replaces the student's and heads' by their shards) plus the largest total the CPU
  allocator reported to ``torch.profiler`` during the fit, against the rank's planned total;
- time: each rank's process CPU time per step (the median of the steps after the first two;
  its communication threads included, waiting for the other rank not), against the rank's
  planned step plus the planned communication. Calibration and fits at one thread
  (``OMP_NUM_THREADS=1``, the calibration's ``threads``): on this shared CPU a second
  OpenMP thread's spinning is counted as the process's time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import gpu_check
from benchmarks.plan_check import planned
from tests.planning.cpu_fit import RUNS, _config

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    """``radio-lit plan --calibrate --quick`` of this CPU at one thread."""
    path = tmp_path_factory.mktemp("calibration") / "cpu.yaml"
    command = [sys.executable, "-m", "radio_lit", "plan", "--calibrate", str(path), "--quick"]
    run = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert yaml.safe_load(path.read_text())["measured"]["threads"] == 1
    return path


def _planned(kind: str, processes: int, calibration: Path) -> dict:
    name, strategy, extra = RUNS[kind]
    config = _config(name)
    overrides = gpu_check.size_overrides(config, "cpu", None)
    args = ["--config", str(config.files[0]), "--gpus", str(processes), "--gpu", "h100"]
    args += ["--json", "--calibration", str(calibration), "--step", "1"]
    stage = planned([*args, *overrides, *extra])
    assert stage["strategy"] == strategy
    return stage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fit(kind: str, processes: int) -> dict[int, dict]:
    """``{rank: {"peak": bytes, "step_s": CPU seconds}}`` of ``cpu_fit.py``'s fits."""
    command = [sys.executable, "-m", "tests.planning.cpu_fit", kind]
    if processes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}"]
        launch += [f"--master-port={_free_port()}", "-m", "tests.planning.cpu_fit", kind]
        command = [*launch, "--devices", str(processes)]
    run = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"rank"')]
    return {row["rank"]: row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("kind", RUNS)
def test_the_plan_holds_and_times_what_a_real_fit_does(kind, processes, calibration):
    stage = _planned(kind, processes, calibration)
    measured = _fit(kind, processes)
    assert sorted(measured) == list(range(processes))
    planned_ranks = {r["rank"]: r for r in stage["ranks"]}  # the first rank of each kind
    communication = stage["communication"]["ms"]
    ratios = {}
    for rank, fit in measured.items():
        plan = planned_ranks.get(rank, planned_ranks[0])  # FSDP2's ranks are alike
        memory = plan["memory_gib"]["total"] * 2**30 / fit["peak"]
        time = (plan["step_ms"]["total"] + communication) / (fit["step_s"] * 1e3)
        ratios[rank] = f"memory {memory:.2f}x, time {time:.2f}x"
        if processes == 1:  # on two, gloo's buffers land in the peak or not, run to run
            assert abs(memory - 1) <= 0.15, (kind, processes, ratios)
        assert abs(time - 1) <= 0.25, (kind, processes, ratios)
