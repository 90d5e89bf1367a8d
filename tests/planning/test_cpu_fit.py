"""``radio-lit plan`` against real Lightning fits on this CPU, on one process and on two (gloo):
step time per rank within 25 % and memory per rank within 15 % on both (what
docs/cost.md reports). Time is asserted only with ``RADIO_LIT_TIMING=1``, on a quiet machine
(:data:`TIMED`); the suite asserts the memory.

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
  FSDP2 replaces the student's and heads' by their shards) plus the most bytes the CPU
  allocator's events in ``torch.profiler`` held during the fit (gloo's copies freed on its
  own thread included, kernels' workspaces left out: ``test_cpu_step._profiled_peak``),
  against the rank's planned total;
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
import torch
import torch.nn.functional as F
import yaml

from benchmarks import gpu_check
from benchmarks.plan_check import planned
from radio_lit.planning.counting import StepCounter
from radio_lit.planning.time_model import load_time_model
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
    """``radio-lit plan --calibrate --quick`` of this CPU at one thread, into a folder that
    does not exist yet (the command makes it)."""
    path = tmp_path_factory.mktemp("calibration") / "new" / "cpu.yaml"
    command = [sys.executable, "-m", "radio_lit", "plan", "--calibrate", str(path), "--quick"]
    run = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"--calibration {path}" in run.stdout  # how to use it
    return path


@pytest.mark.slow
def test_a_quick_calibration_of_this_cpu_is_read_by_the_plan(calibration):
    written = yaml.safe_load(calibration.read_text())
    measured = written["measured"]
    assert measured["timer"] == "process CPU time" and measured["threads"] == 1
    assert measured["versions"]["torch"] == str(torch.__version__)
    assert {"date", "commit", "how", "collectives"} <= set(measured)
    assert all(r[-1] > 0 for r in written["gemm"]["float32"])
    dims = {(r[1], r[2]) for r in written["attention"]["float32"]}
    assert dims == {(d, p) for d in (64, 72, 80, 128) for p in (0, 1)}
    assert written["memory_gb_per_s"] > 0 and written["op_us"] >= 0
    # the reference: one distillation at three batches, the same operations on more bytes
    steps = written["reference_steps"]
    assert [s["batch"] for s in steps] == [2, 8, 32]
    assert len({s["operations"] for s in steps}) == 1 and steps[0]["bytes"] < steps[2]["bytes"]
    # gloo between two processes: each collective a bandwidth and a latency
    assert set(written["collectives"]) == {"all-reduce", "all-gather", "reduce-scatter"}
    assert all(rate > 0 and latency >= 0 for rate, latency in written["collectives"].values())
    model = load_time_model(calibration)
    assert model.collectives == written["collectives"]
    # FSDP2's host work per sharded tensor beyond its collectives, between the two gloo ranks
    assert written["fsdp2_us_per_tensor"] > 0
    assert model.fsdp2_us_per_tensor == written["fsdp2_us_per_tensor"]
    assert model.copy_gb_per_s == written["copy_gb_per_s"]
    assert model.optimizer_gb_per_s == written["optimizer_gb_per_s"] > 0
    # a product the calibration measured, priced at what it measured
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    counter = StepCounter()
    with counter:
        F.linear(a, b)
    rate = next(r[3] for r in written["gemm"]["float32"] if r[:3] == [256, 256, 256])
    rest = counter.ops.moved["other"] / (model.memory_gb_per_s * 1e9)
    rest += counter.ops.calls["other"] * model.op_us * 1e-6
    gemm = model.price(counter.ops)["other"] - rest * 1e3
    assert gemm == pytest.approx(2 * 256**3 / (rate * 1e12) * 1e3, rel=1e-6)


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


#: Timing on a shared 2-core CPU, asserted only on a quiet machine (``RADIO_LIT_TIMING=1``):
#: beside the README's ``pytest -n 2`` a step's CPU time moved 0.63-1.39x of the plan on two
#: gloo processes and 1.27-1.35x on one (the oldest versions' CI run; alone the same fits
#: held within 25 %): docs/cost.md.
TIMED = bool(os.environ.get("RADIO_LIT_TIMING"))


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("kind", RUNS)
def test_the_plan_holds_and_times_what_a_real_fit_does(kind, processes, calibration):
    stage = _planned(kind, processes, calibration)
    assert "gloo's collectives measured" in stage["basis"]["communication"]
    measured = _fit(kind, processes)
    assert sorted(measured) == list(range(processes))
    planned_ranks = {r["rank"]: r for r in stage["ranks"]}  # the first rank of each kind
    communication = stage["communication"]["ms"]
    ratios = {}  # rank -> (memory, time): plan / measured
    for rank, fit in measured.items():
        plan = planned_ranks.get(rank, planned_ranks[0])  # FSDP2's ranks are alike
        memory = plan["memory_gib"]["total"] * 2**30 / fit["peak"]
        time = (plan["step_ms"]["total"] + communication) / (fit["step_s"] * 1e3)
        ratios[rank] = (round(memory, 3), round(time, 3))
    assert all(abs(memory - 1) <= 0.15 for memory, _ in ratios.values()), (kind, ratios)
    if TIMED:
        assert all(abs(time - 1) <= 0.25 for _, time in ratios.values()), (kind, ratios)
