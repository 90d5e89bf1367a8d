"""``radio-lit plan``'s memory per rank against a real Lightning fit on this CPU: three steps
of a recipe at CPU sizes (``benchmarks/gpu_check.py``'s ``--device cpu`` build: tiny teachers,
the CPU student, float32) under its own strategy on one process, planned with the same
overrides at ``--step 1`` (the fit's peak is in a step after the first, with the earlier
step's gradients and the optimizer state).

- measured: the tensors made before the fit still alive in its step 1 (teachers, buffers;
  FSDP2 replaces the student's and heads' by their shards) plus the largest total the CPU
  allocator reported to ``torch.profiler`` during the fit;
- planned: the rank's total (weights, gradient buckets, optimizer state, EMA, teachers and
  the counted step peak); within 15 %.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.plan_check import planned
from tests.planning.cpu_fit import RUNS, _config

ROOT = Path(__file__).resolve().parents[2]


def _planned(config: gpu_check.ShippedConfig, extra: list[str]) -> dict:
    overrides = gpu_check.size_overrides(config, "cpu", None)
    args = ["--config", str(config.files[0]), "--gpus", "1", "--gpu", "h100", "--json"]
    return planned([*args, "--step", "1", *overrides, *extra])


@pytest.mark.slow
@pytest.mark.parametrize("kind", RUNS)
def test_the_plan_holds_what_a_real_fit_holds(kind):
    name, strategy, extra = RUNS[kind]
    config = _config(name)
    stage = _planned(config, extra)
    assert stage["strategy"] == strategy
    planned = stage["ranks"][0]["memory_gib"]["total"] * 2**30
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "tests.planning.cpu_fit", kind]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    measured = int(run.stdout.strip().splitlines()[-1])
    assert abs(planned / measured - 1) <= 0.15, (kind, planned / 2**20, measured / 2**20)
