"""RADIOTeacher: a radio-lit export (and, given a clone, NVlabs' loader) as a teacher."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import radio_lit
from radio_lit.teachers import RADIOTeacher
from tests.builders import cpu_trainer, image_batches, tiny_module
from tests.export.conftest import exported, trained  # noqa: F401  (fixtures)

EXACT = dict(rtol=0, atol=1e-5)


def _images(height: int = 64, width: int = 96) -> torch.Tensor:
    return torch.rand(2, 3, height, width, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("adaptor", ["backbone", "clip", "sam"])
def test_export_outputs_are_the_loaded_models(exported: Path, adaptor: str) -> None:  # noqa: F811
    path = exported / "student.safetensors"
    teacher = RADIOTeacher(str(path), adaptor=adaptor, follow_student=True)
    images = _images()
    with torch.no_grad():
        expected = radio_lit.load(path)(images)[adaptor]
    out = teacher(images, teacher.view_size((4, 6)))
    torch.testing.assert_close(out.features, expected.features, **EXACT)
    if adaptor == "sam":
        assert out.summary is None and not teacher.has_summary
    else:
        torch.testing.assert_close(out.summary, expected.summary, **EXACT)
        assert teacher.summary_dim == expected.summary.shape[-1]
    assert teacher.feature_dim == expected.features.shape[-1]


def test_a_student_distills_from_an_export(exported: Path, tmp_path: Path) -> None:  # noqa: F811
    teachers = {
        "radio": RADIOTeacher(str(exported / "student.pth"), follow_student=True),
        "radio_dino": RADIOTeacher(str(exported / "student.pth"), adaptor="dino"),
    }
    module = tiny_module(teachers=teachers)
    before = {k: v.clone() for k, v in module.student.state_dict().items()}
    trainer = cpu_trainer(tmp_path, max_steps=3)
    trainer.fit(module, image_batches(num_images=12, batch_size=4))
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    after = module.student.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert set(module.heads) == {"radio", "radio_dino"}


def test_unknown_adaptor_lists_the_models_outputs(exported: Path) -> None:  # noqa: F811
    with pytest.raises(ValueError, match=r"no adaptor 'siglip'.*\['clip', 'dino', 'sam'\]"):
        RADIOTeacher(str(exported / "student.pth"), adaptor="siglip")


@pytest.mark.parametrize("loader", ["torch_hub", "transformers"])
def test_remote_code_is_an_explicit_opt_in(loader: str) -> None:
    with pytest.raises(ValueError, match="runs the Python code of .*set trust_remote_code: true"):
        RADIOTeacher("nvidia/C-RADIOv3-H", loader=loader)


@pytest.mark.skipif(
    not os.environ.get("RADIO_REPO"),
    reason="set RADIO_REPO to a local clone of NVlabs/RADIO (with einops)",
)
def test_nvlabs_loader_from_a_local_clone(exported: Path) -> None:  # noqa: F811
    teacher = RADIOTeacher(
        str(exported / "student.pth"),
        loader="torch_hub",
        hub_repo=os.environ["RADIO_REPO"],
        adaptor="dino",
        trust_remote_code=True,
    )
    images = _images()
    with torch.no_grad():
        expected = radio_lit.load(exported / "student.pth")(images)["dino"]
    out = teacher(images, (64, 96))
    torch.testing.assert_close(out.features, expected.features, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.summary, expected.summary, rtol=1e-4, atol=1e-4)
