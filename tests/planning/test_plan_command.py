"""``radio-lit plan`` through the real command: a plan of a config it builds (the table and
``--json`` with the same figures), and bad input as one line with exit code 2.

Each command line runs ``radio_lit.cli.app.main`` (what the ``radio-lit`` console script runs)
in a process of its own forked from the tests' fork server (:mod:`tests.forking`: a fork, not
the ~7 CPU seconds of a fresh interpreter's imports), two at a time (one per core)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from radio_lit.core.errors import TRACEBACK_ENV
from tests import forking

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart-c-radio.yaml")
FSDP2_BF16 = [
    '--trainer.strategy={"class_path": "radio_lit.distributed.strategies.ModelParallelStrategy"}',
    "--trainer.precision=bf16-mixed",
]


def _concurrently(commands: dict[str, list[str]], folder: Path) -> dict[str, forking.Outcome]:
    """``radio-lit plan ARGS`` for each of ``commands``, each in a forked process of its own
    (in the repository, as the README runs it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(TRACEBACK_ENV, None)
    forking.ensure_server()

    def run(name: str) -> forking.Outcome:
        argv = ["plan", *commands[name]]
        return forking.run(
            "radio_lit.cli.app:main", [argv], folder / name.replace(" ", "-"), env=env, cwd=ROOT
        )

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(commands, pool.map(run, commands), strict=True))


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The quickstart's plan at 2 H200s under FSDP2 and bf16-mixed, as a table (beside its
    balanced layout) and as JSON (two processes)."""
    command = ["--config", QUICKSTART, "--gpus", "2", "--gpu", "h200", *FSDP2_BF16]
    return _concurrently(
        {"table": [*command, "--compare-layouts"], "json": [*command, "--json"]},
        tmp_path_factory.mktemp("plans"),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The bad command lines, run concurrently (each a process of its own)."""
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
        "step": ["--config", QUICKSTART, "--step", "-1"],
    }
    return _concurrently(commands, folder)


def _one_line_error(run: forking.Outcome) -> str:
    assert run.exitcode == 2, run.stderr[-2000:]
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


def test_a_negative_step(runs):
    line = _one_line_error(runs["step"])
    assert "--step must be a training step >= 0, got -1" in line


@pytest.mark.slow
def test_table_and_json_hold_the_same_figures(plans):
    table, data = plans["table"], plans["json"]
    assert table.exitcode == 0 and data.exitcode == 0, table.stderr[-2000:] + data.stderr
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
    assert f"{plan['step_ms']:,.1f} ms averaged over the resolution draws" in table.stdout
    assert f"({plan['largest_step_ms']:,.1f} ms at the largest)" in table.stdout
    assert f"{plan['images_per_s_per_gpu']:,.1f} images/s per GPU" in table.stdout
    per_view = sum(plan["cache"]["bytes_per_view"].values())
    assert f"{per_view / 2**20:,.2f} MiB per view" in table.stdout
    # the EMA student's gather, in bf16, half of it sent by each of 2 ranks (padding: < 1 %)
    ema = next(
        c for c in plan["communication"]["collectives"] if c["name"] == "EMA student weights"
    )
    assert ema["op"] == "all-gather" and ema["dtype"] == "bfloat16"
    student = plan["parameters"]["student"]  # the EMA student's trunk is the student's copy
    assert student * 2 / 2 <= ema["sent_gb"] * 1e9 <= 1.01 * student * 2 / 2
    assert f"EMA student weights all-gather {ema['sent_gb']:.3f} GB bfloat16" in table.stdout
    read = plan["cache_read"]  # two ranks of one node, each reading its views
    largest = max(sum(r["images"].values()) for r in plan["ranks"])
    assert read["gb_per_node"] == pytest.approx(2 * largest * per_view / 1e9)
    assert read["ms"] == pytest.approx(read["gb_per_node"] / read["read_gb_per_s"] * 1e3)
    assert f"reads {read['gb_per_node']:,.2f} GB per node and step" in table.stdout
    assert "assumed strategy: FSDP2 (--trainer.strategy on the command line)" in table.stdout
    assert "assumed precision: bf16-mixed (--trainer.precision on the command line)" in table.stdout


@pytest.mark.slow
def test_the_table_compares_the_layouts(plans):
    """``--compare-layouts``: the configured layout's plan (the JSON's), then the balanced one
    (one rank kind running both partitions: 3 low and 1 high image), then the balanced one
    packed (its attention kernel stated), and one line each."""
    table, plan = plans["table"], json.loads(plans["json"].stdout)
    assert plan["layout"] == "blocks" and set(plan["waiting"]["ranks"]) == {"0", "1"}
    idle = plan["waiting"]["idle_share"]
    assert "layout blocks: mean work per rank" in table.stdout
    assert f"{idle:.1%} of the GPU-time is ranks waiting" in table.stdout
    assert "rank 0: low 3 x 64 px, high 1 x 128 px" in table.stdout
    assert "layout balanced: mean work per rank" in table.stdout
    lines = table.stdout.split("layouts of ", 1)[1].splitlines()
    assert lines[1].split()[0] == "blocks" and f"idle {idle:.1%}" in lines[1]
    assert lines[2].split()[0] == "balanced" and "idle 0.0%" in lines[2]
    assert lines[3].startswith("  balanced, packed ") and "idle 0.0%" in lines[3]
    assert "balanced / blocks: " in lines[4] and "balanced, packed / blocks: " in lines[5]
    assert table.stdout.count("assumed packed student attention: padded (a GPU's default") == 1
