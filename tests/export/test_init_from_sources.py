"""``model.init_from`` of the other published layouts, exact at step 0 (<= 1e-5 relative):
transformers' ``RadioModel`` of the C-RADIOv4 layout saved with ``save_pretrained``, timm's
``vit_*_radio_v4`` saved as a timm folder, an NVlabs checkpoint holding σReparam
parametrized and its EMA, and (with ``RADIO_REPO``) a checkpoint as NVlabs' own code loads it."""

from __future__ import annotations

import os
import warnings
from argparse import Namespace
from pathlib import Path

import pytest
import timm
import torch
from timm.models import save_for_hf

from radio_lit.data.views import normalize_view
from radio_lit.export.published import read_published, realize_spectral_reparam
from tests.builders import tiny_module, tiny_student
from tests.export.test_init_from_published import imported_module, relative

#: A C-RADIOv4-H-like layout at tiny size: 3 summary tokens, 2 registers, no final norm.
TRUNK = {"depth": 2, "embed_dim": 32, "num_heads": 2}


def c_radio_student(max_resolution: int = 256, **overrides):
    return tiny_student(
        max_resolution=max_resolution,
        model_kwargs={**TRUNK, "final_norm": False},
        num_cls_tokens=3,
        num_registers=2,
        cpe_align_corners=False,
        **overrides,
    )


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.eval()


def without_registers(tokens: torch.Tensor) -> torch.Tensor:
    """``[B, 3 + 2 + h w, D]`` (summary tokens, registers, patches) without the registers."""
    return torch.cat([tokens[:, :3], tokens[:, 5:]], dim=1)


def student_tokens(module, images: torch.Tensor) -> torch.Tensor:
    """The student's summary tokens and patch features, ``[B, 3 + h w, D]``."""
    with torch.no_grad():
        view = normalize_view(images, *module.conditioner.values)
        out = module.eval().student(view)
    return torch.cat([out.summary, out.features.flatten(1, 2)], dim=1)


def test_a_transformers_radio_model_saved_with_save_pretrained(tmp_path):
    from transformers import RadioConfig, RadioModel

    config = RadioConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
        max_img_size=256, num_cls_tokens=3, num_registers=2, summary_idxs=[0, 1],
        norm_mean=[0.4, 0.5, 0.6], norm_std=[0.2, 0.3, 0.25],
    )  # fmt: skip
    source = randomized(RadioModel(config), 0)  # LayerScale too: folded into the student's
    source.save_pretrained(tmp_path / "c-radio")
    torch.manual_seed(0)
    module = tiny_module(student=c_radio_student(), init_from=str(tmp_path / "c-radio"))
    assert read_published(tmp_path / "c-radio").format == "transformers RadioModel folder"
    assert module.conditioner.values[0] == pytest.approx((0.4, 0.5, 0.6))
    for size in [(64, 64), (48, 80)]:
        images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = without_registers(source(pixel_values=images).last_hidden_state)
        assert relative(student_tokens(module, images), want) <= 1e-5, size


def test_timm_radio_v4_weights_in_a_timm_folder(tmp_path):
    kwargs = {**TRUNK, "img_size": 64, "reg_tokens": 4}
    source = randomized(timm.create_model("vit_huge_patch16_radio_v4", **kwargs), 2)
    save_for_hf(source, tmp_path / "timm", model_args=kwargs)
    torch.manual_seed(0)
    module = tiny_module(student=c_radio_student(max_resolution=64),
                         init_from=str(tmp_path / "timm"))  # fmt: skip
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    config = source.pretrained_cfg
    with torch.no_grad():
        view = normalize_view(images, config["mean"], config["std"])
        want = without_registers(source.forward_features(view))
    assert module.conditioner.values[0] == pytest.approx(config["mean"])
    assert relative(student_tokens(module, images), want) <= 1e-5


def parametrize_like_nvlabs(state: dict, eps: float) -> dict:
    """``state`` with every block linear weight stored as NVlabs' σReparam parametrization
    (``_SNReweight`` version 2, ``u``/``v`` its singular vectors; the qkv chunked in 3, its
    value chunk without one), the same eval-mode weights."""
    out = dict(state)
    for key in [k for k in state if k.startswith("base_model.blocks.") and k.endswith("weight")]:
        if state[key].ndim != 2:
            continue
        layer, weight = key[: -len(".weight")], out.pop(key).double()
        prefix = f"{layer}.parametrizations.weight."
        qkv = layer.endswith("qkv")
        originals = []
        for c, chunk in enumerate(weight.chunk(3) if qkv else [weight]):
            if qkv and c == 2:  # an identity chunk: stored as it is applied
                originals.append(chunk)
                continue
            original = chunk * 1.7  # the applied weight is original * gamma / sigma
            left, _, right = torch.linalg.svd(original)
            u, v = left[:, 0], right[0]
            gamma = (torch.dot(u, original @ v) + eps) / 1.7
            base = f"{prefix}0.parts.{c}." if qkv else f"{prefix}0."
            out[base + "_u"], out[base + "_v"] = u.float(), v.float()
            out[base + "scale"] = torch.log(torch.expm1(gamma - 0.05)).float().view(1, 1)
            out[base + "_sn_version"] = torch.tensor(2)
            originals.append(original)
        out[prefix + "original"] = torch.cat(originals).float()
    return out


def test_an_nvlabs_checkpoint_with_sigma_reparam_parametrized_and_its_ema(exported, tmp_path):
    """NVlabs' training checkpoints hold σReparam as parametrizations and an EMA, which its
    loader prefers; the student reproduces the EMA's eval-mode weights."""
    from radio_lit.export import read_radio

    config, state = read_radio(exported / "student.pth")
    realized = realize_spectral_reparam(parametrize_like_nvlabs(state, 1e-6))
    for key in [k for k in state if k.startswith("base_model.blocks.")]:
        torch.testing.assert_close(realized[key], state[key], rtol=1e-5, atol=1e-7)
    config = {k: v for k, v in config.items() if k != "radio_lit"}  # as NVlabs writes it
    config.update(cls_token_per_teacher=True, spectral_reparam=True)
    noise = {k: v + 1.0 for k, v in state.items()}  # the raw weights: never read
    ema = parametrize_like_nvlabs(state, 1e-6)
    checkpoint = {"args": Namespace(**config), "state_dict": noise, "state_dict_ema": ema}
    torch.save(checkpoint, tmp_path / "nv.pth.tar")
    published = read_published(tmp_path / "nv.pth.tar")
    assert published.format == "NVlabs checkpoint, state_dict_ema"
    reference = imported_module(exported / "student.pth")
    module = imported_module(tmp_path / "nv.pth.tar")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    want = student_tokens(reference, images)
    assert relative(student_tokens(module, images), want) <= 1e-5


def test_sigma_reparam_is_realized_as_nvidias_loader_realizes_it():
    """NVlabs' ``hubconf.radio_model`` realizes a file's σReparam weights
    (``disable_spectral_reparam``) on a module still in training mode, so its
    ``_SNReweight`` (a torch ``_SpectralNorm``) takes one more power iteration from the file's
    ``u``, ``v`` first: the weight is what torch's own spectral norm gives in training mode.
    Vectors far from converged (a random start) make the step count: 1e-2 apart here."""
    from torch.nn.utils.parametrizations import _SpectralNorm

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 16, generator=generator, dtype=torch.float64)
    torch_norm = _SpectralNorm(weight, n_power_iterations=1, eps=1e-12).double().train()
    u = torch.randn(24, generator=generator, dtype=torch.float64)
    v = torch.randn(16, generator=generator, dtype=torch.float64)
    torch_norm._u.copy_(u / u.norm())
    torch_norm._v.copy_(v / v.norm())
    prefix = "base_model.blocks.0.mlp.fc1.parametrizations.weight."
    state = {prefix + "original": weight, prefix + "0._u": torch_norm._u.clone(),
             prefix + "0._v": torch_norm._v.clone(), prefix + "0.scale": torch.ones(1, 1),
             prefix + "0._sn_version": torch.tensor(1)}  # fmt: skip
    want = torch_norm(weight)  # one power iteration, then W / σ
    got = realize_spectral_reparam(state, eps=1e-12, iterations=1)
    torch.testing.assert_close(got["base_model.blocks.0.mlp.fc1.weight"], want)
    eval_mode = realize_spectral_reparam(state, eps=1e-12)["base_model.blocks.0.mlp.fc1.weight"]
    assert relative(eval_mode, want) > 1e-2


RADIO_REPO = os.environ.get("RADIO_REPO")


@pytest.mark.skipif(not RADIO_REPO, reason="set RADIO_REPO to a local clone of NVlabs/RADIO")
def test_a_checkpoint_as_nvlabs_code_loads_it(exported):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        official = torch.hub.load(
            str(Path(RADIO_REPO).expanduser()), "radio_model", source="local",
            version=str(exported / "student.pth"), adaptor_names=["clip", "dino", "sam"],
        ).eval()  # fmt: skip
    module = imported_module(exported / "student.pth")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = official(images, feature_fmt="NLC")
        view = normalize_view(images, *module.conditioner.values)
        student = module.student(view)
    assert relative(student.features.flatten(1, 2), want["backbone"].features) <= 1e-5
    for name in ("clip", "dino", "sam"):
        features = module.heads[name].features(student.features).flatten(1, 2)
        assert relative(features, want[name].features) <= 1e-5, name


def test_an_nvlabs_hugging_face_folder(trained, exported, tmp_path):
    """NVlabs' Hugging Face layout (``radio/hf_model.py``): ``config.json`` with ``args``, the
    weights under ``radio_model.model.*``, ``radio_model.input_conditioner.*`` and
    ``radio_model.adaptors.<name>.head_mlp|feat_mlp.*``."""
    import json

    from safetensors.torch import save_file

    from radio_lit.export import read_radio
    from tests.export.test_init_from_published import (
        assert_reproduces,
        outputs_in_teacher_space,
    )
    from tests.export.tiny_export import own_outputs

    config, state = read_radio(exported / "student.pth")
    weights = {}
    for key, value in state.items():
        for old, new in (
            ("base_model.", "radio_model.model."),
            ("input_conditioner.", "radio_model.input_conditioner."),
            ("_heads.", "radio_model.adaptors.{}.head_mlp."),
            ("_feature_projections.", "radio_model.adaptors.{}.feat_mlp."),
        ):
            if key.startswith(old):
                rest = key[len(old) :]
                if "{}" in new:
                    name, rest = rest.split(".", 1)
                    new = new.format(name)
                weights[new + rest] = value.contiguous()
    folder = tmp_path / "nvlabs-hf"
    folder.mkdir()
    save_file(weights, str(folder / "model.safetensors"))
    names = [t["name"] for t in config["teachers"]]
    (folder / "config.json").write_text(json.dumps({"args": config, "adaptor_names": names}))
    assert read_published(folder).format == "NVlabs Hugging Face folder"
    module = imported_module(folder)
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    want = own_outputs(trained, images)
    del want["backbone"]
    assert_reproduces(outputs_in_teacher_space(module, images), want)


def test_a_student_with_a_final_norm_is_told_the_source_has_none(tmp_path):
    """C-RADIOv4 has no final LayerNorm (transformers' RadioModel none either): the refusal's
    settings name ``final_norm``, so following them builds the student (no loop)."""
    from transformers import RadioConfig, RadioModel

    config = RadioConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
        max_img_size=256, num_cls_tokens=3, num_registers=2, summary_idxs=[0, 1],
    )  # fmt: skip
    RadioModel(config).save_pretrained(tmp_path / "c-radio")
    with_norm = tiny_student(max_resolution=256, model_kwargs=TRUNK, num_cls_tokens=3,
                             num_registers=2, cpe_align_corners=False)  # fmt: skip
    with pytest.raises(ValueError, match="final norm False.*'final_norm': False"):
        tiny_module(student=with_norm, init_from=str(tmp_path / "c-radio"))
    tiny_module(student=c_radio_student(), init_from=str(tmp_path / "c-radio"))
