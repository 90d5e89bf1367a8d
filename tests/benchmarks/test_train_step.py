"""benchmarks/train_step.py: radio-lit's step beside a plain PyTorch loop on the quickstart,
per phase, with the same first loss."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]  # the repository


@pytest.mark.slow
def test_the_plain_loop_comparison_runs_on_the_quickstart(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--warmup=1"]
    command += ["--steps=1", "--threads=1", "--data.init_args.batch_size=2"]
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("phase"))
    assert header.split()[1:5] == ["ms", "lit", "ms", "plain"]
    rows = {line[:22].strip(): line[22:].split() for line in lines[lines.index(header) + 1 :]}
    for phase in ["views", "teacher clip", "teacher dino", "teacher sam", "student forward"]:
        assert phase in rows and len(rows[phase]) == 11, (phase, out)
    for phase in ["head clip", "normalizers", "losses", "backward", "optimizer", "step"]:
        assert phase in rows and len(rows[phase]) == 11, (phase, out)
    assert "plain teacher sam: segment-anything ImageEncoderViT" in out
    # the same student, heads and teachers at the same initial weights: the same loss
    loss = next(line for line in lines if line.startswith("first loss:"))
    assert float(loss.rsplit("relative difference ", 1)[1].rstrip(")")) < 1e-4, loss
    student = [int(v) for v in rows["student forward"][3:5]]  # top-level operations
    assert student[0] == student[1] > 0
    assert lines[-1].startswith("ratio (radio-lit / plain PyTorch): ")
    float(lines[-1].rsplit(": ", 1)[1])
