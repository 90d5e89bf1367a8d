"""The time model (:mod:`radio_lit.planning.time_model`): each operation the counting sees is
recorded by its own shapes, and priced against a calibration's measured curves (``radio-lit
plan --calibrate --quick`` on this CPU and its file read back: ``test_cpu_fit.py``)."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from radio_lit.core.errors import ConfigError
from radio_lit.planning.counting import StepCounter
from radio_lit.planning.time_model import TimeModel, load_time_model, nearest
from radio_lit.planning.verdict import basis


def _model(**changes) -> TimeModel:
    base = {
        "device": "test device",
        "gemm": {"float32": [[64, 64, 64, 1.0], [1024, 1024, 1024, 4.0]]},
        "attention": {"float32": [[256, 64, 0, 2.0], [256, 64, 1, 1.0], [256, 128, 0, 3.0]]},
        "memory_gb_per_s": 100.0,
        "op_us": 5.0,
        "source": "hand-made",
    }
    return TimeModel(**{**base, **changes})


def test_each_matrix_product_and_attention_is_recorded_by_its_own_shapes():
    linear = nn.Linear(16, 32)
    x = torch.randn(4, 10, 16)
    with FakeTensorMode(allow_non_fake_inputs=True):  # the GPU kernel, as the plan counts it
        q = torch.empty(2, 3, 8, 64)  # batch 2, 3 heads, 8 tokens, head dim 64
    counter = StepCounter()
    with counter, counter.part("student forward"):
        linear(x)
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, False)
        x.exp()
    ops = counter.ops
    # addmm's [40, 16] @ [16, 32]: the batch folded into M, 2 M N K FLOPs (flop_counter's)
    assert ops.gemms == {("student forward", 40, 32, 16, "float32"): 2 * 40 * 32 * 16}
    # torch.utils.flop_counter's sdpa_flop_count: 4 b h s s d
    assert ops.attention == {("student forward", 6, 8, 8, 64, "float32", False): 4 * 6 * 8 * 8 * 64}
    assert ops.moved["student forward"] >= 2 * x.numel() * 4  # exp: read x, write its result
    assert ops.calls["student forward"] >= 3


def test_a_measured_shape_is_priced_at_its_rate_and_others_between():
    rows = [[64, 64, 64, 1.0], [1024, 1024, 1024, 4.0]]
    assert nearest(rows, [64, 64, 64]) == 1.0
    between = nearest(rows, [256, 256, 256])
    assert 1.0 < between < 4.0
    model = _model()
    counter = StepCounter()
    with counter, counter.part("teacher dino"):
        torch.randn(1024, 1024) @ torch.randn(1024, 1024)
    ms = model.price(counter.ops)["teacher dino"]
    flops = 2 * 1024**3
    calls = counter.ops.calls["teacher dino"]
    moved = counter.ops.moved["teacher dino"]  # the two randn's outputs
    expected = flops / 4e12 + moved / 100e9 + calls * 5e-6
    assert math.isclose(ms, expected * 1e3, rel_tol=1e-9)


def test_attention_is_priced_by_head_dim_and_pass_and_an_unmeasured_dtype_is_said():
    model = _model()
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    counter = StepCounter()
    with counter, counter.part("student forward"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, False)
    flops = 4 * 2 * 256 * 256 * 128
    ms = model.price(counter.ops)["student forward"]
    calls = counter.ops.calls["student forward"]
    assert ms == pytest.approx((flops / 3e12 + calls * 5e-6) * 1e3, rel=1e-9)  # head dim 128
    assert model.extrapolated == {"attention bfloat16 priced at float32"}


def test_a_calibration_file_that_is_not_one_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_time_model(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("device: x\n")
    with pytest.raises(ConfigError, match="missing gemm, attention, memory_gb_per_s, op_us"):
        load_time_model(bad)
    bad.write_text("device: x\ngemm: {float32: [[1, 2\n")  # a file cut short
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML \(.* at line 3, column 1"):
        load_time_model(bad)
    bad.write_text("- device\n- gemm\n")
    with pytest.raises(ConfigError, match="a YAML mapping of keys is expected, got a list"):
        load_time_model(bad)
    bad.write_text("device: x\ngemm: 3\nattention: {}\nmemory_gb_per_s: 1\nop_us: 2\n")
    with pytest.raises(ConfigError, match="a value is not what radio-lit plan --calibrate writes"):
        load_time_model(bad)


def test_a_per_phase_calibration_or_gpu_file_that_is_not_one_is_a_one_line_error(tmp_path):
    from radio_lit.planning.devices import device
    from radio_lit.planning.time_model import load_calibration

    phases = tmp_path / "phases.yaml"
    phases.write_text("device: h100\nsource: a run\nteachers: {gflop: 1, ms: 2}\n")
    with pytest.raises(
        ConfigError, match=r"not a per-phase calibration \(missing student, optimizer, rest\)"
    ):
        load_calibration(str(phases))
    phases.write_text("teachers: [1\n")
    with pytest.raises(ConfigError, match="--calibration .*phases.yaml: not valid YAML"):
        load_calibration(str(phases))
    phases.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match="--gpu .*phases.yaml: a YAML mapping of keys"):
        device(str(phases))


def test_calibration_names_a_shipped_gpu_run_or_a_file_and_says_its_basis(tmp_path):
    from radio_lit.planning.devices import Calibration
    from radio_lit.planning.time_model import load_calibration

    h100, h200 = load_calibration("h100"), load_calibration("h200")
    assert load_calibration(None) == h100  # the default: the H100 run
    assert isinstance(h200, Calibration) and h200.device == "h200"
    # benchmarks/README.md's H200 phases: teachers 63.4 ms for 32 x 670.07 GFLOP at 989 TFLOP/s
    assert h200.teacher_efficiency == pytest.approx(32 * 670.07e9 / 63.4e-3 / 989e12, rel=1e-3)
    assert "calibrated on h200" in h200.basis and "2026-11-28" in h200.basis
    assert "extrapolated" in h100.basis
    curves = tmp_path / "cpu.yaml"
    curves.write_text(
        yaml.safe_dump(
            {
                "device": "a CPU",
                "measured": {"date": "today", "commit": "abc"},
                "gemm": {"float32": [[8, 8, 8, 0.1]]},
                "attention": {"float32": [[64, 64, 0, 0.1], [64, 64, 1, 0.1]]},
                "memory_gb_per_s": 5.0,
                "op_us": 2.0,
            }
        )
    )
    model = load_calibration(str(curves))
    assert isinstance(model, TimeModel) and model.basis.startswith("measured on a CPU")


def test_the_optimizer_runs_at_its_measured_rate_and_fsdp2_costs_per_tensor():
    model = _model(copy_gb_per_s=20.0, optimizer_gb_per_s=50.0, fsdp2_us_per_tensor=150.0)
    plain = model.times({"other": 4.0}, 1_000_000)
    sharded = model.times({"other": 4.0}, 500_000, sharded_tensors=40)
    assert plain["optimizer"] == pytest.approx(28e6 / 50e9 * 1e3)  # AdamW: 28 bytes a parameter
    assert sharded["optimizer"] == pytest.approx(plain["optimizer"] / 2)  # the local shard's
    assert plain["rest"] == 4.0 and sharded["rest"] == pytest.approx(4.0 + 40 * 0.150)
    assert sharded["student"] == plain["student"] == 0.0  # the host's work is not the student's
    older = _model(copy_gb_per_s=20.0).times({}, 1_000_000)["optimizer"]
    assert older == pytest.approx(28e6 / 20e9 * 1e3)  # a file without the optimizer's: the copy's
    no_copy = _model().times({}, 1_000_000)["optimizer"]
    assert no_copy == pytest.approx(28e6 / 100e9 * 1e3)  # nor a copy: memory_gb_per_s


def test_a_measured_calibration_says_whether_it_is_the_planned_gpus():
    """A calibration file prices at its device's measured rates: of the planned GPU when that
    GPU measured it (``torch.cuda.get_device_name``'s name holds the GPU's key), else, from a
    device ``devices.yaml`` lacks (a CPU), as they are, and said so; not called an
    extrapolation (a per-phase calibration's is: ``test_loop_step.py``)."""
    name = "NVIDIA H100 80GB HBM3 (SXM5)"
    on_h100 = _model(device="NVIDIA H100 80GB HBM3")
    assert on_h100.on("h100") is on_h100
    assert basis(name, on_h100, "h100")["step time"].startswith(
        "measured on NVIDIA H100 80GB HBM3 (hand-made); range from"
    )
    on_cpu = _model(device="x86_64")
    assert on_cpu.on("h100") is on_cpu
    assert f"not scaled to {name}" in basis(name, on_cpu, "h100")["step time"]
    assert "extrapolated" not in basis(name, on_cpu, "h100")["step time"]
    grace = _model(device="NVIDIA GH200 480GB")  # a word of its name, not a part of one
    assert grace.on("h100") is grace


def test_a_file_measured_on_one_gpu_plans_another_by_the_two_gpus_peaks():
    """Calibrate on the GPU you have, plan for the one you want: an H200's file planned for a
    B200 prices its products at 2250 / 989 of the H200's rates and its memory-bound operations
    at 8.0 / 4.8 of its bandwidth (devices.yaml's datasheet rows), the host's cost as
    measured; the plan says it was extrapolated."""
    from radio_lit.planning.counting import OpRecord

    h200 = _model(device="NVIDIA H200", optimizer_gb_per_s=40.0)
    b200 = h200.on("b200")
    assert b200.scaled_to == "b200" and h200.scaled_to == ""
    ops = OpRecord()
    ops.gemms[("student forward", 1024, 1024, 1024, "float32")] = 2e12
    ops.moved["other"] = 4e9
    ops.calls["other"] = 1000
    before, after = h200.price(ops), b200.price(ops)
    assert after["student forward"] == pytest.approx(before["student forward"] * 989 / 2250)
    host = 1000 * 5.0e-3  # ms: op_us as measured
    assert after["other"] - host == pytest.approx((before["other"] - host) * 4.8 / 8.0)
    optimizer = [m.times({}, 1_000_000)["optimizer"] for m in (h200, b200)]
    assert optimizer[1] == pytest.approx(optimizer[0] * 4.8 / 8.0)
    step = basis("NVIDIA B200 (HGX)", b200, "b200")["step time"]
    assert step.startswith("measured on NVIDIA H200 (hand-made); extrapolated to NVIDIA B200")
    assert "not scaled" not in step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_quick_calibration_of_the_gpu_is_written_and_read(tmp_path):
    """``radio-lit plan --calibrate --quick`` on CUDA (its CPU proxy: ``test_cpu_fit.py``):
    bfloat16 and float16 curves, the optimizer's rate, the collectives said unmeasured, the
    file read back by the plan's time model."""
    from radio_lit.planning.calibrate import write_calibration

    path = tmp_path / "gpu.yaml"
    written = write_calibration(path, "cuda", quick=True)
    assert set(written["gemm"]) == set(written["attention"]) == {"bfloat16", "float16"}
    assert written["measured"]["timer"] == "wall time, synchronised"
    assert written["optimizer_gb_per_s"] > 0 and written["copy_gb_per_s"] > 0
    assert written["collectives"] == {} and written["fsdp2_us_per_tensor"] == 0.0
    model = load_time_model(path)
    assert model.optimizer_gb_per_s == written["optimizer_gb_per_s"]
    assert nearest(model.gemm["bfloat16"], [1024, 1024, 1024]) > 0
