"""benchmarks/harness.py: what every benchmark changes to build a shipped config on one machine
with nothing to download."""

from __future__ import annotations

import importlib
import inspect

import pytest

from benchmarks import harness
from benchmarks.gpu_check import shipped_configs

CONFIGS = [c for c in shipped_configs() if not c.overlay]


def _teachers(config):
    teachers = (harness.merged(config.files).get("model") or {}).get("teachers") or {}
    for name, entry in teachers.items():
        while isinstance((entry.get("init_args") or {}).get("teacher"), dict):
            entry = entry["init_args"]["teacher"]  # RescaledTeacher, FixedPatternTeacher
        yield name, entry


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_every_shipped_teacher_gets_random_weights_and_nothing_to_load(config):
    for name, entry in _teachers(config):
        init = {**(entry.get("init_args") or {}), **harness.random_init(entry)}
        module, kind = entry["class_path"].rsplit(".", 1)
        parameter = inspect.signature(getattr(importlib.import_module(module), kind)).parameters
        default = getattr(parameter.get("pretrained"), "default", None)
        assert init.get("pretrained", default) in (None, False), (name, init)
        assert not init.get("checkpoint"), (name, init)
        if kind != "RADIOTeacher":
            assert "." not in str(init.get("model", "")), (name, init)


def test_stage1_on_one_cpu_is_one_float32_process():
    stage1 = harness.load_config(harness.ROOT / "configs" / "stage1.yaml")
    out, notes = harness.one_device(stage1, strategy="auto", float32=True)
    assert {"--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto"} <= set(out)
    assert "--trainer.precision=32-true" in out
    for name, entry in stage1["model"]["teachers"].items():
        if entry["init_args"].get("dtype") == "bfloat16":
            assert f"--model.teachers.{name}.init_args.dtype=float32" in out, name
    assert any(note.startswith("precision 32-true") for note in notes)


def test_stage1_on_one_gpu_keeps_its_strategy_on_one_rank():
    stage1 = harness.load_config(harness.ROOT / "configs" / "stage1.yaml")
    out, _ = harness.one_device(stage1)
    assert "--trainer.strategy.init_args.data_parallel_size=1" in out
    assert not any(a.startswith(("--trainer.strategy=", "--trainer.precision")) for a in out)
