"""RADIOTeacher: a radio-lit export (and, given a clone, NVlabs' loader) as a teacher."""

from __future__ import annotations

import json
import os
from argparse import Namespace
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.data import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

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


@pytest.mark.parametrize("backend", ["native", "remote_code"])
def test_remote_code_is_an_explicit_opt_in(backend: str) -> None:
    loader = "torch_hub" if backend == "native" else "transformers"  # torch_hub is NVlabs' code
    with pytest.raises(ValueError, match="runs the Python code of .*set trust_remote_code: true"):
        RADIOTeacher("nvidia/C-RADIOv3-H", loader=loader, backend=backend)


#: The tiny C-RADIO model's teachers, as NVlabs' checkpoints list them (``args.teachers``).
NVLABS_TEACHERS = [
    {"name": "siglip2-g", "use_summary": True},
    {"name": "dino_v3", "use_summary": True},
    {"name": "sam3", "use_summary": False},
]


@pytest.fixture(scope="module")
def nvlabs_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny C-RADIOv4-shaped model with random weights as NVlabs publishes one: the
    torch.hub file (``args`` and ``state_dict``: ``base_model.*``, ``input_conditioner.*``,
    adaptor MLPs) and the Hugging Face folder of the same weights (``model.safetensors``
    under ``radio_model.*`` with ``summary_idxs``; ``config.json`` with transformers'
    ``RadioConfig`` fields and NVlabs' ``args``). Patch 16, width 32, 3 summary tokens then 7
    registers, no final norm, a 16 x 16 CPE grid (256 px)."""
    folder = tmp_path_factory.mktemp("nvlabs")
    generator = torch.Generator().manual_seed(7)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.5

    kwargs = {"depth": 2, "embed_dim": 32, "num_heads": 2}
    vit = timm.create_model("vit_tiny_patch16_224", final_norm=False, **kwargs)
    blocks = {k: rand(*v.shape) for k, v in vit.state_dict().items() if k.startswith("blocks.")}
    base = {
        "patch_generator.embedder.weight": rand(32, 3 * 16 * 16) * 0.1,
        "patch_generator.pos_embed": rand(1, 16 * 16, 32),
        "patch_generator.cls_token.token": rand(10, 32),
        **blocks,
    }
    conditioner = {
        "norm_mean": torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1),
        "norm_std": torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1),
    }
    adaptors = {}
    for teacher in NVLABS_TEACHERS:
        for group, width in (("_heads", 24), ("_feature_projections", 40)):
            prefix = f"{group}.{teacher['name']}."
            shapes = {"fc1": (48, 32), "final.0": (48,), "final.2": (width, 48)}
            for layer, shape in shapes.items():
                adaptors[prefix + layer + ".weight"] = rand(*shape)
                adaptors[prefix + layer + ".bias"] = rand(shape[0])
    args = Namespace(
        model="vit_tiny_patch16_224", model_kwargs=kwargs, num_classes=0, model_norm=False,
        cpe_max_size=256, teachers=NVLABS_TEACHERS, cls_token_per_teacher=True,
        cpe_num_registers=7,
    )  # fmt: skip
    state = {
        **{f"base_model.{k}": v for k, v in base.items()},
        **{f"input_conditioner.{k}": v for k, v in conditioner.items()},
        **adaptors,
    }
    hub_file = folder / "c-radio_tiny.pth.tar"
    torch.save({"args": args, "state_dict": state}, hub_file)
    hf = folder / "hf"
    hf.mkdir()
    weights = {f"radio_model.model.{k}": v for k, v in base.items()}
    weights.update({f"radio_model.input_conditioner.{k}": v for k, v in conditioner.items()})
    weights["radio_model.summary_idxs"] = torch.tensor([0, 1])
    save_file({k: v.contiguous() for k, v in weights.items()}, str(hf / "model.safetensors"))
    config = {
        "model_type": "radio", "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "patch_size": 16, "max_img_size": 256, "num_cls_tokens": 3,
        "num_registers": 7, "summary_idxs": [0, 1], "preferred_resolution": [64, 64],
        "args": {**vars(args), "model_kwargs": kwargs},
    }  # fmt: skip
    (hf / "config.json").write_text(json.dumps(config))
    return hub_file, hf


#: ``hubconf.py`` of a local stand-in for NVlabs/RADIO whose ``radio_model`` computes the
#: checkpoint format's definition (``tests/export/radio_reference.py``, written from NVlabs'
#: ``RADIOModel.forward``): the remote-code path, offline.
REFERENCE_HUBCONF = """
from collections import namedtuple

import torch
from torch import nn

from tests.export.radio_reference import reference_forward

Output = namedtuple("Output", "summary features")


class Model(nn.Module):
    patch_size = 16
    preferred_resolution = (64, 64)

    def __init__(self, checkpoint, names):
        super().__init__()
        self.checkpoint, self.names = checkpoint, names
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, x, feature_fmt="NLC"):
        out = reference_forward(self.checkpoint, x)
        return {n: Output(*out[n]) for n in ["backbone", *self.names]}


def radio_model(version="", adaptor_names=None, **kwargs):
    return Model(torch.load(version, weights_only=False), adaptor_names or [])
"""


@pytest.mark.parametrize("size", [(64, 64), (48, 80)], ids=str)
def test_native_transformers_equals_the_remote_code_path(nvlabs_model, tmp_path, size) -> None:
    """transformers' own RadioModel (the default for loader: transformers; no repository
    code) gives the teacher NVlabs' outputs: the backbone summary is the summary teachers'
    tokens concatenated, the features the patch tokens."""
    hub_file, hf = nvlabs_model
    (tmp_path / "hubconf.py").write_text(REFERENCE_HUBCONF)
    remote = RADIOTeacher(
        str(hub_file), loader="torch_hub", hub_repo=str(tmp_path), trust_remote_code=True
    )
    native = RADIOTeacher(str(hf), loader="transformers", follow_student=True)
    assert type(native.model).__name__ == "RadioModel"  # transformers' class, no remote code
    assert native.resolution == 64 and native.patch_size == 16
    assert (
        (native.summary_dim, native.feature_dim)
        == (2 * 32, 32)
        == (
            remote.summary_dim,
            remote.feature_dim,
        )
    )
    images = _images(*size)
    from_native, from_remote = native(images, size), remote(images, size)
    assert from_native.features.shape == (2, size[0] // 16, size[1] // 16, 32)
    torch.testing.assert_close(from_native.features, from_remote.features, **EXACT)
    torch.testing.assert_close(from_native.summary, from_remote.summary, **EXACT)


def test_native_transformers_names_what_it_cannot_give(nvlabs_model, tmp_path) -> None:
    hub_file, hf = nvlabs_model
    with pytest.raises(ValueError, match="native RadioModel has no adaptor heads.*backend: remote"):
        RADIOTeacher(str(hf), loader="transformers", adaptor="dino_v3")
    with pytest.raises(ValueError, match="backend: remote_code applies to loader: transformers"):
        RADIOTeacher(str(hub_file), loader="torch_hub", backend="remote_code")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "radio", "hidden_size": 32}))
    save_file({"other.weight": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="not in NVlabs' C-RADIO layout.*missing or mismatched"):
        RADIOTeacher(str(tmp_path), loader="transformers")


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


def test_an_nvlabs_file_with_loader_export_is_pointed_at_the_config_that_works(nvlabs_model):
    """NVlabs' own file is no radio-lit export: the refusal names the teacher settings that
    load it (NVlabs' code by torch_hub, and its einops) and model.init_from as a start."""
    hub_file, _ = nvlabs_model
    works = "loader: torch_hub, hub_repo: .*trust_remote_code: true .*einops"
    with pytest.raises(ValueError, match=f"not written by radio-lit export.*init_from.*{works}"):
        RADIOTeacher(str(hub_file))  # loader: export, the default


def test_nvlabs_code_without_einops_is_refused_naming_it(monkeypatch) -> None:
    """NVlabs' code importing einops where it is not installed: one line naming the install
    (only then: code that does not import it loads without it)."""

    def load(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'einops'", name="einops")

    monkeypatch.setattr(torch.hub, "load", load)
    with pytest.raises(ImportError, match="imports einops.*pip install einops"):
        RADIOTeacher("nvidia/C-RADIOv3-H", loader="torch_hub", trust_remote_code=True)
