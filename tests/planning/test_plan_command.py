"""``radio-lit plan`` through the real command: a plan of a config it builds (the table and
``--json`` with the same figures), and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart-c-radio.yaml")


def _radio_lit(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RADIO_LIT_TRACEBACK", None)
    command = [sys.executable, "-m", "radio_lit", "plan", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def _concurrently(commands: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    with ThreadPoolExecutor(2) as pool:
        return dict(
            zip(commands, pool.map(lambda a: _radio_lit(*a), commands.values()), strict=True)
        )


@pytest.fixture(scope="module")
def plans():
    """The quickstart's plan at 2 H200s, as a table and as JSON (two fresh processes)."""
    return _concurrently(
        {
            "table": ["--config", QUICKSTART, "--gpus", "2", "--gpu", "h200"],
            "json": ["--config", QUICKSTART, "--gpus", "2", "--gpu", "h200", "--json"],
        }
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The bad command lines, run concurrently (each is a fresh process)."""
    folder = tmp_path_factory.mktemp("plan")
    broken = folder / "broken.yaml"
    broken.write_text(
        Path(QUICKSTART)
        .read_text(encoding="utf-8")
        .replace("model: vit_tiny_patch16_224", "model: vit_nope_patch16_224"),
        encoding="utf-8",
    )
    commands = {
        "unknown gpu": ["--config", QUICKSTART, "--gpu", "h10"],
        "not built": ["--config", str(broken)],
        "gpus": ["--config", QUICKSTART, "--gpus", "7"],
    }
    return _concurrently(commands)


def _one_line_error(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("radio-lit: error:")]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    return lines[0]


def test_unknown_gpu_names_the_closest_and_the_table(runs):
    line = _one_line_error(runs["unknown gpu"])
    assert "--gpu h10" in line and "did you mean 'h100'" in line
    assert all(name in line for name in ("a100", "h100", "h200", "b200"))


def test_a_config_that_does_not_build(runs):
    line = _one_line_error(runs["not built"])
    assert "model.student" in line and "vit_nope_patch16_224" in line


def test_gpus_that_do_not_split_the_partitions(runs):
    line = _one_line_error(runs["gpus"])
    assert "--gpus 7" in line and "model.partitions.low.batch_size=6" in line


@pytest.mark.slow
def test_table_and_json_hold_the_same_figures(plans):
    table, data = plans["table"], plans["json"]
    assert table.returncode == 0 and data.returncode == 0, table.stderr[-2000:] + data.stderr
    plan = json.loads(data.stdout)
    assert plan["gpus"] == 2 and plan["gpu"]["name"].startswith("NVIDIA H200")
    ranks = {tuple(r["partitions"]) for r in plan["ranks"]}
    assert ranks == {("low",), ("high",)}  # one rank each at 2 GPUs
    for rank in plan["ranks"]:  # FeatSharp runs in the high partition only (min_student_grid)
        upsampled = {"upsampler siglip2"} if rank["partitions"] == ["high"] else set()
        parts = {"teacher siglip2", "teacher dino_v3", "student forward", "backward"}
        assert set(rank["flops_per_image"]) - {"other"} >= parts | upsampled
        assert rank["memory_gib"]["total"] > rank["memory_gib"]["step peak"] > 0
        assert f"{rank['memory_gib']['total']:.2f}" in table.stdout
    assert f"{plan['step_ms']:,.1f} ms" in table.stdout
    assert f"{plan['images_per_s_per_gpu']:,.1f} images/s per GPU" in table.stdout
    per_view = sum(plan["cache"]["bytes_per_view"].values())
    assert f"{per_view / 2**20:,.2f} MiB per view" in table.stdout
