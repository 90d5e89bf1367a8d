"""A run started from a published model carries on: what it trained is what its checkpoint,
every export of it and a next stage hold, the published model's pixel normalization included
(its ``input_conditioner``, which need not be the student class's default: CLIP's here)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import radio_lit
from radio_lit.callbacks import TeacherStatsEstimation
from radio_lit.export import (
    checkpoint_inference_model,
    module_inference_model,
    save_radio,
    save_safetensors,
)
from radio_lit.normalizers import PhiS
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student
from tests.export.test_init_from_published import SeedPerStep, _teachers, relative
from tests.export.tiny_export import STUDENT, saved_run

#: OpenAI CLIP's pixel statistics: a published model's, unlike the tiny student's 0.5 default.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: The run's config as its config.yaml names it (one shared summary token, 2 registers).
CONFIG = {
    "model": {"student": {**STUDENT, "init_args": {**STUDENT["init_args"], "num_cls_tokens": 1}}}
}  # noqa: E501


def _frozen(params):  # learning rate 0: the function may not move
    return torch.optim.SGD(params, lr=0.0)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A published model (NVlabs' layout) whose conditioner is CLIP's, PHI-S fitted."""
    torch.manual_seed(0)
    student = tiny_student(num_registers=2, cpe_align_corners=False)
    module = tiny_module(student=student, teachers=_teachers(), normalizer=PhiS,
                         student_mean=CLIP_MEAN, student_std=CLIP_STD)  # fmt: skip
    for name, output in module.run_teachers(torch.rand(4, 3, 96, 96)).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    folder = tmp_path_factory.mktemp("published")
    return save_radio(module_inference_model(module.eval()), folder / "published.pth")


def _module(start: Path | str) -> torch.nn.Module:
    torch.manual_seed(0)
    student = tiny_student(num_registers=2, cpe_align_corners=False)  # default mean/std 0.5
    return tiny_module(student=student, teachers=_teachers(), normalizer=PhiS,
                       optimizer=_frozen, init_from=str(start))  # fmt: skip


def _adapted(root: Path, start: Path | str, steps: int = 3) -> Path:
    """``steps`` training steps at learning rate 0 from ``start``, PHI-S estimated over the
    first two (each refit composes the imported heads); the run's ``last.ckpt``."""
    module = _module(start)
    callbacks = [TeacherStatsEstimation(steps=2, refit_every=1), SeedPerStep()]
    cpu_trainer(root, max_steps=steps, callbacks=callbacks).fit(module, image_batches(8, 4))
    return saved_run(module, root / "run", config=CONFIG)


def _assert_same_model(got, want, tolerance: float) -> None:
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = got(images), want(images)
    assert a.keys() == b.keys()
    for name in b:
        assert relative(a[name].features, b[name].features) <= tolerance, name
        if b[name].summary is not None:
            assert relative(a[name].summary, b[name].summary) <= tolerance, name


@pytest.fixture(scope="module")
def adapted(source, tmp_path_factory) -> Path:
    return _adapted(tmp_path_factory.mktemp("stage1"), source)


def test_the_checkpoint_keeps_the_published_pixel_normalization(source, adapted):
    """The conditioner is state of the run: saved, exported (radio-lit export, radio_lit.load
    of the .ckpt), not rebuilt from the config's student default (0.2-1.2 relative off)."""
    state = torch.load(adapted, weights_only=True)["state_dict"]
    assert state["conditioner.mean"].tolist() == pytest.approx(CLIP_MEAN)
    assert state["conditioner.std"].tolist() == pytest.approx(CLIP_STD)
    exported = checkpoint_inference_model(adapted)
    assert exported.input_conditioner.norm_mean.flatten().tolist() == pytest.approx(CLIP_MEAN)
    _assert_same_model(exported, radio_lit.load(source), 1e-4)
    _assert_same_model(radio_lit.load(adapted), radio_lit.load(source), 1e-4)


def test_a_next_stage_starts_from_the_checkpoint_with_its_imported_heads(source, adapted):
    """Stage 2's ``init_from: last.ckpt`` of a run with imported heads (their published
    shapes, the space they predict in, the conditioner): its export is stage 1's."""
    module = _module(adapted).eval()
    assert module.conditioner.values[0] == pytest.approx(CLIP_MEAN)
    assert module.imported_heads.names == ["clip", "dino", "sam"]
    _assert_same_model(module_inference_model(module), radio_lit.load(source), 1e-4)


@pytest.mark.parametrize("form", ["radio", "safetensors"])
def test_a_next_stage_starts_from_the_first_ones_export(source, adapted, form, tmp_path):
    """Stage 1 exported (NVlabs' .pth, radio-lit's safetensors) starts stage 2 as the model."""
    model = checkpoint_inference_model(adapted)
    if form == "radio":
        path = save_radio(model, tmp_path / "stage1.pth")
    else:
        path, _ = save_safetensors(model, tmp_path / "stage1.safetensors")
    module = _module(path).eval()
    assert module.conditioner.values[0] == pytest.approx(CLIP_MEAN)
    _assert_same_model(module_inference_model(module), radio_lit.load(source), 1e-4)


@pytest.mark.parametrize("extend", [False, True], ids=["adapt", "extend"])
def test_adapt_and_extend_export_in_nvlabs_layout_with_the_published_token_layout(
    exported, extend, tmp_path
):
    """The real recipes' layout (a summary token per published teacher, registers; the
    model's own backbone output a teacher of the run, ``c-radio``): the backbone's own entry
    is no NVlabs teacher, so the export's tokens meet the published teachers (and, extending,
    the new one) and NVlabs' layout is written; the imported heads keep their adaptor types."""
    from radio_lit.export import read_radio
    from radio_lit.teachers import RADIOTeacher
    from tests.teachers.tiny import tiny_dinov2_teacher

    source = exported / "student.pth"
    names = ["clip", "dino", "sam", *(["dino2"] if extend else [])]
    torch.manual_seed(0)
    student = tiny_student(**{**STUDENT["init_args"], "num_cls_tokens": None}, summary_tokens=names)
    teachers = {"c-radio": RADIOTeacher(str(source), adaptor="backbone", summary=False),
                **_teachers(), **({"dino2": tiny_dinov2_teacher()} if extend else {})}  # fmt: skip
    module = tiny_module(student=student, teachers=teachers, normalizer=PhiS, init_from=str(source))
    assert module.imported_heads.backbones() == ["c-radio"]
    if extend:  # the new teacher's statistics (a fresh head predicts the normalized space)
        output = module.run_teachers(torch.rand(4, 3, 96, 96), ("dino2",))["dino2"]
        module.normalizers["dino2"].update(output.features)
        module.normalizers["dino2"].fit()
    path = save_radio(module_inference_model(module.eval()), tmp_path / "exported.pth")
    config, state = read_radio(path)
    assert [t["name"] for t in config["teachers"]] == names
    assert not any(k.startswith(("_heads.c-radio", "_feature_projections.c-radio")) for k in state)
    source_types = {t["name"]: t["type"] for t in read_radio(source)[0]["teachers"]}
    assert {t["name"]: t["type"] for t in config["teachers"][:3]} == source_types
    if not extend:  # nothing trained: the export is the published model (its backbone too)
        _assert_same_model(radio_lit.load(path), radio_lit.load(source), 1e-5)


class MomentsAtBackward(pl.Callback):
    """Per step, whether the optimizer holds moments for an imported head's composed layer
    and for a layer no refit touches, as the step's backward starts."""

    def __init__(self) -> None:
        self.composed: list[bool] = []
        self.untouched: list[bool] = []

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        state = trainer.optimizers[0].state
        heads = pl_module.heads["clip"].features
        self.composed.append(bool(state.get(heads.out.weight)))
        self.untouched.append(bool(state.get(heads.inp.weight)))


def test_a_refit_forgets_the_moments_of_the_layer_it_composes(source, tmp_path):
    """Each refit turns an imported head's last layer into the new normalized space; Adam's
    moments of that layer, gathered in the old space, are dropped with it, and rebuilt by
    the next update (the other layers keep theirs)."""
    module = _module(source)
    module.optimizer_factory = lambda params: torch.optim.AdamW(params, lr=1e-4)
    moments = MomentsAtBackward()
    callbacks = [TeacherStatsEstimation(steps=2, refit_every=1), SeedPerStep(), moments]
    cpu_trainer(tmp_path, max_steps=4, callbacks=callbacks).fit(module, image_batches(16, 4))
    # step 0: no update yet; step 1: refit, dropped; steps 2-3: estimation over, rebuilt
    assert moments.composed == [False, False, True, True]
    assert moments.untouched == [False, True, True, True]


def test_load_gives_nvlabs_backbone_summary_on_request(exported):
    """NVlabs' loader's backbone summary is the summary teachers' tokens concatenated
    (NVlabs/RADIO hubconf.py: ``summary_idxs`` = the sorted token indices of the teachers with
    ``use_summary``; radio/radio_model.py ``RADIOModel``: ``all_summary[:, summary_idxs]``
    flattened): here CLIP's and DINO's tokens, ``[B, 2 D]``, not SAM's."""
    path = exported / "student.pth"
    first = radio_lit.load(path)
    nvlabs = radio_lit.load(path, backbone_summary="summary_idxs")
    assert nvlabs.summary_idxs == [0, 1]
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, got = first(images), nvlabs(images)
        dim = want["backbone"].summary.shape[1]
        summary = got["backbone"].summary
        assert summary.shape == (2, 2 * dim)
        torch.testing.assert_close(summary[:, :dim], want["backbone"].summary)
        for name, part in (("clip", summary[:, :dim]), ("dino", summary[:, dim:])):
            torch.testing.assert_close(first._heads[name](part), want[name].summary)
    with pytest.raises(ValueError, match="backbone_summary='mean'.*'summary_idxs'"):
        radio_lit.load(path, backbone_summary="mean")
