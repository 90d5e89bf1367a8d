"""Every released RADIO family, in the forms NVIDIA publishes it (tests/export/nvlabs_files.py),
imported by ``model.init_from`` with :class:`PublishedStudent`: at step 0 the backbone (its
``summary_idxs`` summary and its features, feature normalizer applied) and every shipped head
equal an independent reference forward written from NVlabs' facts (tests/export/
radio_reference.py), <= 1e-5 relative, in eval mode."""

from __future__ import annotations

from argparse import Namespace

import pytest
import torch

from radio_lit.data.views import normalize_view
from radio_lit.export import PublishedStudent
from radio_lit.normalizers import PhiS
from tests.builders import tiny_module
from tests.export.nvlabs_files import nvlabs_checkpoint, save_hf_folder, save_pth
from tests.export.radio_reference import reference_forward

#: The tiny run's teachers' (summary, feature) widths (tests/builders.tiny_module).
WIDTHS = {"clip": (32, 64), "dino": (48, 48), "sam": (None, 32)}
FORMS = {"pth.tar": lambda c, p: save_pth(c, p / "model.pth.tar"),
         "hf": lambda c, p: save_hf_folder(c, p / "hf")}  # fmt: skip


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def imported(path) -> torch.nn.Module:
    torch.manual_seed(0)
    student = PublishedStudent(source=str(path))
    return tiny_module(student=student, normalizer=PhiS, init_from=str(path)).eval()


#: One case per distinct layout (test time): LayerScale as grandma, the huge, giant and so400m
#: NVlabs names, 8 and 10 prefix tokens, the feature normalizers, the HF folder; the other
#: families share one of these layouts at tiny size (vit_large_patch16_v2_224 differs from the
#: base one by its name only; all 11 families x both forms were run by hand, docs/published.md).
CASES = [
    ("c-radio_v3-b", "pth.tar"),
    ("radio_v2.5-g", "pth.tar"),
    ("radio_v2.5-h-norm", "pth.tar"),
    ("c-radio_v4-so400m", "pth.tar"),
    ("c-radio_v4-h", "pth.tar"),
    ("radio_v2.5-h-norm", "hf"),
]


@pytest.mark.parametrize(("family", "form"), CASES)
def test_a_released_family_imports_exactly_at_step_0(family, form, tmp_path):
    checkpoint = nvlabs_checkpoint(family, WIDTHS)
    module = imported(FORMS[form](checkpoint, tmp_path))
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    want = reference_forward(checkpoint, images)
    with torch.no_grad():
        out = module.student(normalize_view(images, *module.conditioner.values))
        heads = {n: (h.summary(out.summary[:, module.summary_token[n]]) if h.summary else None,
                     h.features(out.features).flatten(1, 2))
                 for n, h in module.heads.items()}  # fmt: skip
    assert out.summary.shape[1] == 3  # unique teacher names, not the 4 entries
    summary, features = want.pop("backbone")
    # NVlabs' backbone summary: the summary_idxs tokens (first entry of each summary teacher)
    slots = sorted(module.summary_token[n] for n in module.heads if module.heads[n].summary)
    assert relative(out.summary[:, slots].flatten(1), summary) <= 1e-5
    assert relative(out.features.flatten(1, 2), features) <= 1e-5
    assert set(want) == set(heads)
    for name, (summary, features) in want.items():
        assert relative(heads[name][1], features) <= 1e-5, name
        assert (summary is None) == (heads[name][0] is None), name
        if summary is not None:
            assert relative(heads[name][0], summary) <= 1e-5, name


def test_the_feature_normalizers_are_state_and_written_back_by_the_export(tmp_path):
    """radio_v2.5-h-norm: the normalizers are buffers of the student (in its state dict, so in
    every checkpoint), and ``radio-lit export``'s NVlabs file holds them as the source did,
    with ``radio_lit.load`` reproducing the source's outputs."""
    from radio_lit.export import module_inference_model, save_radio
    from radio_lit.export.files import load

    checkpoint = nvlabs_checkpoint("radio_v2.5-h-norm", WIDTHS)
    module = imported(save_pth(checkpoint, tmp_path / "source.pth.tar"))
    source = checkpoint["state_dict"]
    own = module.student.state_dict()
    assert torch.equal(own["feature_normalizer.tx"], source["_feature_normalizer.tx"])
    assert torch.equal(own["intermediate_normalizer.means"],
                       source["_intermediate_feature_normalizer.means"])  # fmt: skip
    exported = save_radio(module_inference_model(module), tmp_path / "export.pth.tar")
    state = torch.load(exported, map_location="cpu", weights_only=False)["state_dict"]
    for key in [k for k in source if k.startswith(("_feature_norm", "_intermediate_feature"))]:
        assert torch.equal(state[key], source[key]), key
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    want = reference_forward(checkpoint, images)
    with torch.no_grad():
        got = load(exported)(images)
    assert relative(got["backbone"].features.flatten(1, 2), want["backbone"][1]) <= 1e-5
    assert relative(got["dino"].features.flatten(1, 2), want["dino"][1]) <= 1e-5
    # timm's RADIO classes have no feature normalizer (_convert_radio keeps radio_model.model.*)
    from radio_lit.export.timm_radio import timm_incompatibilities

    assert any("feature normalizer" in p for p in timm_incompatibilities(load(exported)))


@pytest.mark.parametrize(
    ("where", "setting", "kind"),
    [("args", {"spatial_mlp_version": "attn"}, "'attn' feature head"),
     ("args", {"mlp_version": "v1", "spatial_mlp_version": None}, "MLP v1 summary head"),
     ("teacher", {"fd_upsample_factor": 2}, "upsampling feature head")],
)  # fmt: skip
def test_a_head_radio_lit_cannot_import_is_refused_naming_its_kind(where, setting, kind, tmp_path):
    """NVlabs' GenericAdaptor reads mlp_version / spatial_mlp_version from args or the teacher
    entry, fd_upsample_factor from the entry (radio/adaptor_generic.py): refused at read."""
    from radio_lit.export.published import read_published

    checkpoint = nvlabs_checkpoint("c-radio_v4-h", WIDTHS)
    if where == "args":
        vars(checkpoint["args"]).update(setting)
    else:
        checkpoint["args"].teachers[1].update(setting)
    path = save_pth(checkpoint, tmp_path / "model.pth.tar")
    with pytest.raises(ValueError, match=kind) as error:
        read_published(path)
    assert "\n" not in str(error.value)


def test_a_student_without_the_source_s_feature_normalizer_is_refused_naming_the_option(tmp_path):
    """A config's own CPEViT for a file with ``_feature_normalizer.*``: one line naming the
    setting (``feature_normalizer: true``), not a deep load error."""
    from tests.builders import tiny_student

    path = save_pth(nvlabs_checkpoint("radio_v2.5-h-norm", WIDTHS), tmp_path / "m.pth.tar")
    student = tiny_student(max_resolution=128, model_kwargs={"depth": 2, "embed_dim": 32,
                           "num_heads": 2, "final_norm": False}, num_cls_tokens=3,
                           num_registers=5, cpe_align_corners=False)  # fmt: skip
    with pytest.raises(ValueError, match="feature_normalizer: true") as error:
        tiny_module(student=student, normalizer=PhiS, init_from=str(path))
    assert "\n" not in str(error.value)


def test_nvlabs_e_radio_is_refused_naming_what_to_do_instead(tmp_path):
    """NVlabs' E-RADIO (``e-radio_v2``: radio/common.py; ``args.model`` an ``eradio_*`` of
    radio/eradio_model.py, whose ``ERADIO.patch_embed.conv_down`` is a stack of ``Conv2d_BN``
    ``conv``/``bn`` pairs): one line saying it cannot be imported and what to start from."""
    from radio_lit.export.published import read_published

    state = {
        "base_model.patch_embed.conv_down.0.conv.weight": torch.zeros(32, 3, 3, 3),
        "base_model.patch_embed.conv_down.0.bn.weight": torch.ones(32),
        "input_conditioner.norm_mean": torch.zeros(3, 1, 1),
        "input_conditioner.norm_std": torch.ones(3, 1, 1),
    }
    checkpoint = {"args": Namespace(model="eradio", teachers=[]), "state_dict": state}
    path = save_pth(checkpoint, tmp_path / "eradio_v2.pth.tar")
    with pytest.raises(ValueError, match="E-RADIO.*cannot import.*ERadio") as error:
        read_published(path)
    assert "\n" not in str(error.value)
