"""docs/own-images.md's YAML trains: its real-teacher families load their weights from the
files it names, and every argument of ``ImageFolderDataModule`` is shown.

The page's YAML is read from the page itself; the test writes random-weight files of the same
families (open_clip SigLIP2, timm DINOv2 with registers, segment-anything SAM) at tiny sizes
and with the page's suffixes, puts their paths and a tiny image folder where the page has its
placeholders, shrinks what a CPU cannot run in seconds (widths, resolutions, batch), and
trains two steps with the page's command for a CPU (``bf16-mixed`` kept). Everything else is
the page's: classes, teacher options, normalizer, losses, callbacks, data arguments.
"""

from __future__ import annotations

import copy
import inspect
import re
import sys
from pathlib import Path

import open_clip
import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file
from segment_anything.modeling import ImageEncoderViT

from radio_lit.cli import app as cli
from radio_lit.data import ImageFolderDataModule
from tests.teachers.tiny import TINY_DINOV2_TIMM_KWARGS, TINY_SAM_ENCODER, TINY_SIGLIP_CFG

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-images.md"


def page_config() -> dict:
    """The page's one YAML block, as ``radio-lit fit`` would read it."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "the page shows one complete YAML"
    return yaml.safe_load(blocks[0])


def test_the_yaml_shows_every_argument_of_the_image_folder_data_module():
    data = page_config()["data"]
    assert data["class_path"] == "radio_lit.data.ImageFolderDataModule"
    arguments = set(inspect.signature(ImageFolderDataModule.__init__).parameters) - {"self"}
    assert set(data["init_args"]) == arguments


def test_the_page_counts_its_paths():
    """The page's "replace the N paths": its YAML has N placeholders (``/weights/…``,
    ``/data/…``)."""
    text = PAGE.read_text(encoding="utf-8")
    words = {"three": 3, "four": 4, "five": 5, "six": 6}
    said = re.search(r"replace the (\w+) paths", text)
    assert said, "the page says how many paths to replace"
    placeholders = re.findall(r": (/(?:weights|data)/\S+)", text)
    assert len(placeholders) == words[said.group(1)], placeholders


def _weights(folder: Path) -> dict[str, Path]:
    """Random-weight files of the page's three families at tiny sizes, in the formats their
    loaders read: an open_clip state dict, a timm state dict, segment-anything's SAM file."""
    torch.manual_seed(0)
    cfg = dict(TINY_SIGLIP_CFG)
    cfg.pop("custom_text")
    siglip2 = open_clip.CustomTextCLIP(**cfg)
    dino = timm.create_model("vit_base_patch14_reg4_dinov2", **TINY_DINOV2_TIMM_KWARGS)
    sam = ImageEncoderViT(**TINY_SAM_ENCODER)
    files = {
        "siglip2": folder / "siglip2.safetensors",  # the page's suffixes
        "dino_v2": folder / "dino_v2.safetensors",
        "sam": folder / "sam.pth",
    }
    for name, model in (("siglip2", siglip2), ("dino_v2", dino)):
        save_file({k: v.detach().clone() for k, v in model.state_dict().items()}, files[name])
    torch.save({f"image_encoder.{k}": v for k, v in sam.state_dict().items()}, files["sam"])
    return files


def cpu_options() -> list[str]:
    """The options of the page's command for a run on the CPU (after ``--config my-run.yaml``)."""
    command = r"^radio-lit fit --config my-run\.yaml (--trainer\.accelerator cpu.*)$"
    found = re.findall(command, PAGE.read_text(encoding="utf-8"), flags=re.M)
    assert len(found) == 1, "the page gives one command for a CPU"
    return found[0].split()


def _images(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        pixels = torch.randint(0, 256, (96, 128, 3), dtype=torch.uint8, generator=generator)
        Image.fromarray(pixels.numpy()).save(folder / f"{i}.jpg")
    return folder


@pytest.mark.slow
def test_the_pages_yaml_trains_two_steps_on_an_image_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["radio-lit"])
    config = page_config()
    run = copy.deepcopy(config)
    files = _weights(tmp_path)
    teachers = run["model"]["teachers"]
    for name, teacher in teachers.items():
        args = teacher["init_args"]
        key = "pretrained" if "pretrained" in args else "checkpoint"
        assert args[key].startswith("/weights/"), (name, args[key])  # the page's placeholder
        args[key] = str(files[name])
    # the same families, shrunk: open_clip's model config, timm's kwargs, SAM's encoder
    teachers["siglip2"]["init_args"]["model_cfg"] = TINY_SIGLIP_CFG
    teachers["dino_v2"]["init_args"]["model_kwargs"] = TINY_DINOV2_TIMM_KWARGS
    sam = teachers["sam"]["init_args"]
    assert sam.pop("model_type") == "vit_b"
    sam["encoder_kwargs"] = TINY_SAM_ENCODER
    student = run["model"]["student"]["init_args"]
    student["model_kwargs"] = {"depth": 2, "embed_dim": 48, "num_heads": 2}
    run["model"]["student_resolution"] = 64  # 4x4 grid: DINOv2 56 px, SAM 2x2 mosaics of 64
    data = run["data"]["init_args"]
    assert data["train_dir"].startswith("/data/") and data["val_dir"].startswith("/data/")
    data["train_dir"] = str(_images(tmp_path / "images" / "train", 8))
    data["val_dir"] = str(_images(tmp_path / "images" / "val", 2))
    data.update(crop_size=64)
    trainer = run["trainer"]
    trainer.update(max_steps=2, val_check_interval=2)  # the page's precision: bf16-mixed
    trainer["logger"]["init_args"]["save_dir"] = str(tmp_path / "logs")
    trainer["enable_progress_bar"] = False
    path = tmp_path / "my-run.yaml"
    path.write_text(yaml.safe_dump(run))

    # the page's command for a CPU, then a batch that 8 images fill
    shrunk = ["--data.init_args.batch_size", "2", "--data.init_args.num_workers", "0"]
    cli.main(["fit", "--config", str(path), *cpu_options(), *shrunk])

    (folder,) = (tmp_path / "logs" / "my-run").glob("version_0*")  # named for the overrides
    checkpoint = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 2
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    assert set(saved["model"]["teachers"]) == {"siglip2", "dino_v2", "sam"}
    assert saved["model"]["teachers"]["sam"]["init_args"]["checkpoint"] == str(files["sam"])
    assert (saved["trainer"]["accelerator"], saved["trainer"]["precision"]) == ("cpu", "bf16-mixed")
