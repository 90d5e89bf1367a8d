"""benchmarks/profile_step.py: every column on the quickstart, and FLOPs counted by
FlopCounterMode that agree with the textbook count of a plain ViT-L forward."""

import logging
import warnings

import pytest

from benchmarks.profile_step import main, vit_forward_flops


@pytest.mark.parametrize("size", [224, 256])
def test_a_plain_vit_l_forward_counts_2_params_tokens_plus_attention(size):
    counted, estimate = vit_forward_flops("vit_large_patch16_224", (size, size))
    tokens = (size // 16) ** 2 + 1
    assert estimate > 2 * 300e6 * tokens  # ViT-L: ~303 M matmul parameters
    assert abs(counted / estimate - 1) < 0.05


@pytest.mark.slow
def test_the_profiler_prints_every_column_for_the_quickstart(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "trace.json"
    for name in ("lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():  # the script ignores warnings: not for later tests
        main(["--warmup=1", "--steps=1", f"--trace={trace}", "--data.init_args.batch_size=2"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("phase"))
    assert header.split() == ["phase", "ms", "aten", "top", "aten", "all", "syncs", "GFLOP"] + [
        "TFLOP/s",
        "%",
        "peak",
    ]
    rows = {line[:22].strip(): line[22:].split() for line in out.splitlines()[1:]}
    phases = ["views", "teacher clip", "teacher dino", "teacher sam", "student forward"]
    phases += ["head clip", "head dino", "head sam", "grid matching", "normalizers", "losses"]
    phases += ["backward", "optimizer", "guard", "data wait", "Lightning + logging", "step"]
    for phase in phases:
        assert phase in rows, (phase, out)
        assert len(rows[phase]) == 7
    assert int(rows["student forward"][1]) > 0 and float(rows["student forward"][4]) > 0
    assert float(rows["backward"][4]) > float(rows["student forward"][4])  # ~2x the forward
    for line in ("images/s:", "peak:", "peak memory:", "scalar reads per step"):
        assert line in out
    # the guard's verdict is the step's one read of a device value (not a logging step)
    device = out.split("of device tensors, host-device synchronisations")[1].split("\n")
    assert device[0].endswith(": 1") and "radio_lit/callbacks/guard.py" in device[1], out
    assert "of host tensors, no synchronisation" in out
    assert "floor (plain timm vit_tiny_patch16_224, same batch): forward" in out
    assert "student forward / floor:" in out and "top 12 operations by" in out
    assert trace.stat().st_size > 0


def test_attention_flops_count_on_a_cpu_too():
    """torch's FlopCounterMode has no formula for SDPA's CPU kernel; the profiler adds it:
    4 * N^2 * d per head forward (QK^T and AV), 2.5x that backward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.phases import cpu_sdpa_mapping

    q = torch.randn(1, 2, 64, 32, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa_mapping()) as counter:
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    assert counter.get_total_flops() == 3.5 * 4 * 64**2 * 32 * 2
