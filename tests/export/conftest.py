"""Shared fixtures: a tiny trained module in RADIO's layout and its two export files."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from radio_lit.export import module_inference_model, save_radio, save_safetensors
from radio_lit.normalizers import PhiS
from radio_lit.students.spectral_reparam import SpectralLinear
from tests.builders import tiny_module, tiny_student
from tests.export.tiny_export import STUDENT


@pytest.fixture(scope="session")
def trained() -> pl.LightningModule:
    """A tiny module in RADIO's layout (one summary token per teacher, SAM's unused; 2
    registers; σReparam), PHI-S statistics fitted, every exported quantity nontrivial."""
    torch.manual_seed(0)
    module = tiny_module(student=tiny_student(**STUDENT["init_args"]), normalizer=PhiS)
    crop = torch.rand(4, 3, 96, 96)
    for name, output in module.run_teachers(crop).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    with torch.no_grad():
        module.student.patch_embed.proj.bias.normal_()
        module.student.cls_token.normal_()
        for layer in module.student.modules():
            if isinstance(layer, SpectralLinear):
                layer.spectral_scale.mul_(1.5)
    return module.eval()


@pytest.fixture(scope="session")
def exported(trained: pl.LightningModule, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export")
    model = module_inference_model(trained)
    save_radio(model, folder / "student.pth")
    save_safetensors(model, folder / "student.safetensors")
    return folder
