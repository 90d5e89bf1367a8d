"""RADIOTeacher: a radio-lit export (and, given a clone, NVlabs' loader) as a teacher."""

from __future__ import annotations

import os
from argparse import Namespace
from pathlib import Path

import pytest
import torch

import radio_lit
from radio_lit.teachers import RADIOTeacher
from radio_lit.teachers.radio import upsample_factor
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
    sam = RADIOTeacher(  # NVlabs' loader builds SAM a summary head; use_summary is false
        str(exported / "student.pth"),
        loader="torch_hub",
        hub_repo=os.environ["RADIO_REPO"],
        adaptor="sam",
        trust_remote_code=True,
    )
    assert not sam.has_summary and sam(images, (64, 96)).summary is None


#: ``hubconf.py`` of a local stand-in for an NVlabs/RADIO clone: ``radio_model`` returns a
#: model with NVlabs' interface (``summary_idxs``, ``adaptors[name].head_idx``, outputs as
#: ``{name: (summary, features)}`` with NLC features) and two adaptors: ``up`` upsamples its
#: features by 2 (``(2h)(2w)`` tokens, as NVlabs' ``upsample_factor``), ``sam`` was trained
#: without a summary. For a version name (NVlabs' releases) each adaptor has its own token
#: slot and ``sam``'s is not in ``summary_idxs``; for a checkpoint file (whose
#: ``args.teachers`` say ``use_summary``) all share slot 0, as in a radio-lit export.
HUBCONF = """
import os
from collections import namedtuple

import torch
from torch import nn

Output = namedtuple("Output", "summary features")


class Adaptor(nn.Module):
    def __init__(self, head_idx, factor):
        super().__init__()
        self.head_idx, self.factor = head_idx, factor
        self.feature = nn.Linear(8, 5 * factor * factor)
        self.summary = nn.Linear(8, 3)

    def forward(self, summary, tokens, rows, cols):
        cells = self.feature(tokens).reshape(len(tokens), rows, cols, self.factor, self.factor, 5)
        cells = cells.permute(0, 1, 3, 2, 4, 5).reshape(len(tokens), -1, 5)
        return Output(self.summary(summary), cells)


class Model(nn.Module):
    patch_size = 4
    preferred_resolution = (16, 16)

    def __init__(self, names, shared):
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, 4)
        self.register_buffer("summary_idxs", torch.tensor([0] if shared else [0, 1]))
        known = {"up": Adaptor(0 if shared else 1, 2), "sam": Adaptor(0 if shared else 2, 1)}
        self.adaptors = nn.ModuleDict({n: known[n] for n in names})

    def forward(self, x, feature_fmt="NLC"):
        grid = self.embed(x)
        rows, cols = grid.shape[-2:]
        tokens = grid.flatten(2).transpose(1, 2)
        out = {"backbone": Output(tokens.mean(1), tokens)}
        for name, adaptor in self.adaptors.items():
            out[name] = adaptor(tokens.mean(1), tokens, rows, cols)
        return out


def radio_model(version="", adaptor_names=None, **kwargs):
    return Model(adaptor_names or [], shared=os.path.isfile(version))
"""


@pytest.fixture
def nvlabs_clone(tmp_path: Path) -> str:
    (tmp_path / "hubconf.py").write_text(HUBCONF)
    return str(tmp_path)


def _nvlabs(
    clone: str, adaptor: str, model: str = "c-radio_v4-h", **kwargs: object
) -> RADIOTeacher:
    return RADIOTeacher(
        model,
        loader="torch_hub",
        hub_repo=clone,
        adaptor=adaptor,
        trust_remote_code=True,
        **kwargs,
    )


def test_an_upsampling_adaptor_gives_its_finer_grid(nvlabs_clone: str) -> None:
    """``(2h)(2w)`` tokens become ``[B, 2h, 2w, C]``, not ``[B, h, w, 4C]`` (space folded
    into channels); the teacher states the finer grid."""
    teacher = _nvlabs(nvlabs_clone, "up")
    out = teacher(_images(16, 24), (16, 24))
    assert out.features.shape == (2, 8, 12, 5) and teacher.feature_dim == 5
    assert teacher.grid_size == (8, 8)
    expected = teacher.model(_images(16, 24))["up"].features.reshape(2, 8, 12, 5)
    torch.testing.assert_close(out.features, expected, rtol=0, atol=0)


def test_a_token_count_without_an_integer_factor_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'up' gave 12 tokens for a 2x3 patch grid.*integer"):
        upsample_factor(12, 2, 3, "up")
    assert upsample_factor(54, 3, 2, "up") == 3


@pytest.mark.parametrize("source", ["version name", "checkpoint file"])
def test_an_adaptor_trained_without_a_summary_gives_none(
    nvlabs_clone: str, source: str, tmp_path: Path
) -> None:
    """NVlabs builds a summary head for SAM too; it was never trained (use_summary: false),
    so it is no target; an adaptor trained with one keeps it. A checkpoint file's
    ``args.teachers`` say so even where its adaptors share a token slot."""
    model = "c-radio_v4-h"
    if source == "checkpoint file":
        model = str(tmp_path / "radio.pth")
        teachers = [{"name": "up", "use_summary": True}, {"name": "sam", "use_summary": False}]
        torch.save({"args": Namespace(teachers=teachers), "state_dict": {}}, model)
    sam = _nvlabs(nvlabs_clone, "sam", model=model)
    assert not sam.has_summary and sam.summary_dim is None
    assert sam(_images(16, 16)).summary is None
    assert _nvlabs(nvlabs_clone, "up", model=model).summary_dim == 3
    assert _nvlabs(nvlabs_clone, "up", model=model, summary=False).summary_dim is None
    with pytest.raises(ValueError, match="without a summary term.*summary: false"):
        _nvlabs(nvlabs_clone, "sam", model=model, summary=True)
