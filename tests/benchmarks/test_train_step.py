"""benchmarks/train_step.py: radio-lit's step beside a plain PyTorch loop on the quickstart,
per phase, with the same first loss."""

import argparse
import logging
import warnings
from pathlib import Path

import pytest
import yaml

import radio_lit.training.matching
from benchmarks import train_step


@pytest.mark.slow
def test_the_plain_loop_comparison_runs_on_the_quickstart(monkeypatch, capsys):
    match_teachers = radio_lit.training.matching.match_teachers
    for name in ("lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():  # the script ignores warnings: not for later tests
        train_step.main(["--warmup=1", "--steps=1", "--data.init_args.batch_size=2"])
    out = capsys.readouterr().out
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
    for phase in ["student forward", "backward", "grid matching"]:  # top-level operations
        lit, plain = (int(v) for v in rows[phase][3:5])
        assert abs(lit - plain) <= 0.1 * plain, (phase, lit, plain)
    assert lines[-1].startswith("ratio (radio-lit / plain PyTorch): ")
    float(lines[-1].rsplit(": ", 1)[1])
    assert radio_lit.training.matching.match_teachers is match_teachers, (
        "the profiler's labels are undone"
    )


def test_a_gpu_run_of_stage1_has_photographs_for_its_whole_batch():
    """Found on an H200: stage 1's batch of 32 on the 10 shipped photographs failed before the
    first step; each pass over them is repeated so that a batch fits."""
    config = yaml.safe_load(Path("configs/stage1.yaml").read_text())
    args = argparse.Namespace(device="cuda", batch_size=None, teacher_depth=8)
    out, _ = train_step.device_overrides(config, args)
    value = dict(a.split("=", 1) for a in out if a.startswith("--data.init_args."))
    assert 10 * int(value["--data.init_args.repeats"]) >= config["data"]["init_args"]["batch_size"]
