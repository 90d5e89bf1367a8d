"""The shipped C-RADIOv4 quickstart exports to timm and transformers as shipped: its EMA
student, trained by ``radio-lit fit --config configs/quickstart-c-radio.yaml``, is written by
``radio-lit export CKPT --ema --format timm``, and the calls that command prints, run as
printed on the input each says it takes, give ``radio_lit.load``'s features of the same EMA
weights (timm's classes on normalized pixels, transformers' ``RadioModel`` on pixels in
[0, 1])."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import timm
import torch
import transformers
import yaml

import radio_lit
from radio_lit.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart-c-radio.yaml"
EXACT = dict(rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart trained for 2 steps (its EMA updated twice), as ``radio-lit fit``
    leaves it; only the schedule, the logger and the data's size are shortened."""
    root = tmp_path_factory.mktemp("quickstart_c_radio")
    short = {
        "trainer": {
            "max_steps": 2,
            "val_check_interval": 2,
            "logger": {"init_args": {"save_dir": str(root)}},
            "enable_model_summary": False,
        },
        "data": {"init_args": {"val_dir": None, "repeats": 1}},
    }
    (root / "short.yaml").write_text(yaml.safe_dump(short))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["radio-lit"])
        cli.main(
            ["fit", "--config", str(CONFIG), "--config", str(root / "short.yaml")]
            + ["--trainer.callbacks.every_n_train_steps", "2"]  # its ModelCheckpoint, the last
        )
    # the run folder is named for what differs from the config: version_0-short-...
    (run,) = (root / "quickstart-c-radio").glob("version_0*")
    return run / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_the_printed_calls_load_the_ema_student_in_timm_and_transformers(
    checkpoint: Path, capsys: pytest.CaptureFixture
) -> None:
    cli.main(["export", str(checkpoint), "--ema", "--format", "timm"])
    printed = capsys.readouterr().out.splitlines()
    folder = checkpoint.parent.parent / "export" / "last-ema-timm"
    assert printed[:2] == [str(folder / "model.safetensors"), str(folder / "config.json")]
    naflex, vit, hf = printed[2:5]
    assert "input: normalized pixels" in naflex and "input: normalized pixels" in vit
    assert "input: pixels in [0, 1]" in hf
    cli.main(["export", str(checkpoint), "--ema", "--format", "safetensors"])
    capsys.readouterr()
    reference = radio_lit.load(checkpoint.parent.parent / "export" / "last-ema.safetensors")
    resolution = reference.config["radio_lit"]["preferred_resolution"]
    assert f"exact at {resolution[0]}x{resolution[1]} px only" in vit

    def run(line: str) -> torch.nn.Module:
        """The call of a printed line, evaluated as printed (its comment dropped)."""
        call = line.split("  # ", 1)[0]
        return eval(call, {"timm": timm, "transformers": transformers}).eval()

    pixels = torch.rand(2, 3, *resolution, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(pixels)["backbone"].features.flatten(1, 2)
        tokens = reference.base_model(reference.input_conditioner(pixels))
        for line in (naflex, vit):
            model = run(line)
            data = timm.data.resolve_data_config({}, model=model)  # as the comment says
            mean = torch.tensor(data["mean"]).view(3, 1, 1)
            std = torch.tensor(data["std"]).view(3, 1, 1)
            got = model.forward_features((pixels - mean) / std)
            assert got.shape[1] == 10 + expected.shape[1]  # 3 summary tokens, 7 registers
            torch.testing.assert_close(got[:, 10:], expected, **EXACT)
            torch.testing.assert_close(got[:, :10], tokens[:, :10], **EXACT)
            assert (model.forward_features(pixels) - got).abs().max() > 0.1  # not its input
        from_hf = run(hf)(pixels)  # pixels in [0, 1]
    torch.testing.assert_close(from_hf.features, expected, **EXACT)
    # RADIO's summary: the summary teachers' tokens (SigLIP2's, DINOv3's) concatenated
    torch.testing.assert_close(from_hf.summary, tokens[:, :2].flatten(1), **EXACT)
    assert re.search(r"vit_\w+_patch16_radio_v4", vit)  # timm's C-RADIOv4 class
