"""The E-RADIO quickstart end to end: ``radio-lit fit`` with falling losses (and the
quickstart's evaluation measures at the end of fit, its segmentation probe trained for 10 steps,
not 100: the test checks that it runs on E-RADIO, not what it learns), ``radio-lit export`` to
safetensors, ``radio_lit.load``, and ``radio-lit evaluate`` printing the token-merging table.
(E-RADIO's ONNX parity is tested in ``tests/export/test_onnx.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import radio_lit
from radio_lit.cli.app import RadioLitCLI, main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [
    str(ROOT / "configs" / "quickstart.yaml"),
    str(ROOT / "configs" / "quickstart-eradio.yaml"),
]


@pytest.mark.slow
def test_eradio_quickstart_trains_exports_loads_and_evaluates(tmp_path, capsys):
    cli = RadioLitCLI(
        args=[
            "fit",
            *[arg for config in CONFIGS for arg in ("--config", config)],
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "25",
            "--trainer.log_every_n_steps",
            "1",
            "--trainer.num_sanity_val_steps",
            "0",
            # the last callback, the segmentation probe: 10 steps of its linear head
            "--trainer.callbacks.steps",
            "10",
            "--trainer.callbacks.warmup_steps",
            "1",
        ]
    )
    assert type(cli.model.student).__name__ == "ERadio"
    (probe,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "SegmentationProbe"]
    assert probe.steps == 10
    run = Path(cli.trainer.logger.log_dir)
    events = EventAccumulator(str(run))
    events.Reload()
    for teacher in ("clip", "dino", "sam"):
        values = [e.value for e in events.Scalars(f"train/{teacher}/feature_loss")]
        assert len(values) == 25, values
        # batches differ: compare the mean of the first and the last five steps
        assert sum(values[-5:]) < sum(values[:5]), f"{teacher} loss did not fall: {values}"
    for measure in ("knn", "zero_shot", "rankme"):  # the quickstart's measures ran on E-RADIO
        assert any(tag.startswith(f"eval/{measure}") for tag in events.Tags()["scalars"]), measure
    checkpoint = run / "checkpoints" / "last.ckpt"

    main(["export", str(checkpoint), "--format", "safetensors"])
    model = radio_lit.load(run / "export" / "last.safetensors")
    images = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        out, direct = model(images), radio_lit.load(checkpoint)(images)
    assert out["dino"].features.shape == (2, 4, 6, 48) and out["sam"].summary is None
    for name in out:
        torch.testing.assert_close(out[name].features, direct[name].features)

    preset = tmp_path / "merging.yaml"
    preset.write_text(
        "trainer:\n  callbacks+:\n    - class_path: radio_lit.evaluation.TokenMerging\n"
        "      init_args: {token_counts: [16, 32, 64], sink_strides: [2, 4], resolution: 128,"
        " per_class: 1}\n"
    )
    capsys.readouterr()
    main(["evaluate", "--ckpt_path", str(checkpoint), "--config", str(preset)])
    printed = capsys.readouterr().out
    assert "eval/token_merging/backbone/sink_4x4/tokens_16" in printed
    assert "| sink layout | 16 tokens | 32 tokens | 64 tokens |" in printed
    assert "| 2x2 | " in printed and "| 4x4 | " in printed
