"""benchmarks/gpu_check.py on this machine's CPU (its building is every test of tests/configs):
one config through the whole script, a missing module named with its package, synthetic data
that holds a batch; on a GPU (``gpu``), the models created there."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from benchmarks import gpu_check


def test_the_check_runs_a_config_and_prints_its_row(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["gpu_check.py"])
    for name in ("lightning.pytorch", "lightning.fabric"):  # the script quiets them
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():  # and ignores warnings: not for the tests after this one
        code = gpu_check.main(["--device", "cpu", "--only", "quickstart.yaml", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    header = next(line for line in out.splitlines() if line.startswith("config"))
    assert header.split() == ["config", "result", "step", "ms", "peak", "GiB", "note"]
    row = next(line for line in out.splitlines() if line.startswith("quickstart.yaml  "))
    assert row.split()[1] == "pass" and float(row.split()[2]) > 0
    assert "as shipped; 1 partition(s), batch 8" in row
    upsampler = next(line for line in out.splitlines() if line.startswith("featsharp/quickstart"))
    assert upsampler.split()[1] == "pass" and "FeatSharpModule" in upsampler, upsampler
    matched = [c for c in gpu_check.shipped_configs() if "quickstart.yaml" in c.name]
    assert {"quickstart.yaml", "featsharp/quickstart.yaml"} <= {c.name for c in matched}
    assert f"{len(matched)} of {len(matched)} configs pass on CPU" in out  # the recipes' twins


def test_a_missing_module_is_named_with_the_package_to_install():
    error = ModuleNotFoundError("No module named 'open_clip'", name="open_clip")
    wrapped = ValueError("model.teachers.siglip2_g: could not build")
    wrapped.__cause__ = error
    assert gpu_check.missing_module(wrapped) == (
        "missing module open_clip (pip install open_clip_torch)"
    )
    assert gpu_check.missing_module(ValueError("another problem")) is None


def test_the_synthetic_data_holds_one_gpu_batch_of_every_recipe():
    """Found on an H200: PHI-S stage 1's one-GPU batch (128) exceeded the 64 synthetic images
    and the config failed before its first step."""
    for config in gpu_check.shipped_configs():
        args = gpu_check.one_device_overrides(gpu_check.merged(config.files), "real", True)
        value = dict(a.split("=", 1) for a in args if a.startswith("--data.init_args."))
        batch = int(value["--data.init_args.batch_size"])
        assert int(value["--data.init_args.num_samples"]) >= batch, config.name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_check_builds_the_models_on_the_gpu(capsys, monkeypatch):
    """On CUDA the models are created on the GPU (no fallback to the host), and step."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():
        code = gpu_check.main(["--only", "quickstart.yaml", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("quickstart.yaml  "))
    assert row.split()[1] == "pass" and "built on the host" not in row, row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_c_radio_ablation_rows_step_on_the_gpu(capsys, monkeypatch):
    """The C-RADIOv4 ablation rows, CPU-sized, forced onto the GPU and built there
    (``FixedPatternTeacher`` calibrates where its wrapped teacher's weights are; CPU proxy:
    tests/teachers/test_fixed_pattern_teacher.py)."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():
        code = gpu_check.main(["--only", "ablations/c-radio/", "--steps", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("ablations/c-radio/")]
    assert code == 0 and rows, out
    assert all(row.split()[1] == "pass" for row in rows), out
