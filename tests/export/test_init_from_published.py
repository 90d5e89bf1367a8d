"""``model.init_from`` of a published RADIO model: the student and heads reproduce the source
at step 0 (float32 round-off, <= 1e-5 relative), and imported heads stay in their teachers'
spaces while the run's statistics are fitted."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from radio_lit.callbacks import TeacherStatsEstimation
from radio_lit.data.views import normalize_view
from radio_lit.export import (
    PublishedStudent,
    checkpoint_inference_model,
    module_inference_model,
    read_radio,
    save_radio,
)
from radio_lit.normalizers import PhiS
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student
from tests.export.tiny_export import STUDENT, TEACHERS, own_outputs, saved_run

SIZES = [(64, 64), (48, 80)]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def imported_module(source: Path | str | dict, **overrides) -> torch.nn.Module:
    """The exports' tiny module (same seed: the same random teachers) started from ``source``."""
    torch.manual_seed(0)
    student = tiny_student(**{**STUDENT["init_args"], **overrides.pop("student", {})})
    return tiny_module(student=student, normalizer=PhiS, init_from=source, **overrides).eval()


def outputs_in_teacher_space(module, images: torch.Tensor) -> dict[str, tuple]:
    """The module's student and heads before any statistics: heads read as teacher space."""
    with torch.no_grad():
        student = module.student(normalize_view(images, *module.conditioner.values))
        outputs = {"backbone": (student.summary, student.features)}
        for name, heads in module.heads.items():
            slot = module.summary_token.get(name)
            summary = heads.summary(student.summary[:, slot]) if slot is not None else None
            outputs[name] = (summary, heads.features(student.features))
    return outputs


def assert_reproduces(got: dict, want: dict) -> None:
    for name, (summary, features) in want.items():
        assert relative(got[name][1], features) <= 1e-5, name
        if summary is not None:
            assert relative(got[name][0], summary) <= 1e-5, name


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_a_radio_lit_export_read_back_reproduces_its_student_and_heads(trained, exported, size):
    module = imported_module(exported / "student.pth")
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
    want = own_outputs(trained, images)
    with torch.no_grad():
        student = trained.student(normalize_view(images, *trained.conditioner.values))
    want["backbone"] = (student.summary, student.features)
    assert module.imported_heads.names == ["clip", "dino", "sam"]
    assert module.conditioner.values[0] == pytest.approx(trained.conditioner.values[0])
    assert_reproduces(outputs_in_teacher_space(module, images), want)


def test_imported_heads_follow_every_refit_of_the_normalizers(trained, exported):
    """Composed with each fit of the run's normalizers, an imported head's prediction mapped
    back by the normalizer is the source's, so the loss after estimation is its fidelity."""
    module = imported_module(exported / "student.pth")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    want = own_outputs(trained, images)
    for statistics, crops in ((module.normalizers, 4), (module.normalizers, 8)):
        for name, output in module.run_teachers(torch.rand(crops, 3, 96, 96)).items():
            statistics[name].update(output.features)
            statistics[name].fit()
        module.imported_heads.follow(module.normalizers, module.heads)
        got = outputs_in_teacher_space(module, images)
        for name in ("clip", "dino", "sam"):
            features = module.normalizers[name].inverse(got[name][1])
            assert relative(features, want[name][1]) <= 1e-5, name


def _teachers(sam: str = "sam") -> dict:
    """The exports' tiny teachers (built in their order, after the student, as there), the SAM
    teacher named ``sam``."""
    from tests.teachers.tiny import tiny_clip_teacher, tiny_dinov2_teacher, tiny_sam_teacher

    return {"clip": tiny_clip_teacher(), "dino": tiny_dinov2_teacher(),
            sam: tiny_sam_teacher(resolution=64)}  # fmt: skip


def test_the_round_trip_keeps_every_published_tensor_bit_identical(exported, tmp_path):
    """NVlabs layout -> radio-lit -> NVlabs layout, nothing trained: every tensor of the file
    comes back bit for bit, the shipped SAM head (no SAM teacher in this run) carried."""
    torch.manual_seed(0)  # the source's token layout: a token per teacher, SAM's unused
    student = tiny_student(**STUDENT["init_args"], summary_tokens=["clip", "dino", "sam"])
    teachers = _teachers()
    del teachers["sam"]
    module = tiny_module(student=student, teachers=teachers, normalizer=PhiS,
                         init_from=str(exported / "student.pth")).eval()  # fmt: skip
    assert list(module.imported_heads.carried) == ["sam"]
    save_radio(module_inference_model(module), tmp_path / "again.pth")
    config, state = read_radio(exported / "student.pth")
    again_config, again = read_radio(tmp_path / "again.pth")
    assert again.keys() == state.keys()
    for key, value in state.items():
        assert again[key].dtype == value.dtype and torch.equal(again[key], value), key
    assert again_config["teachers"][-1] == config["teachers"][-1]  # SAM's entry, carried


class SeedPerStep(pl.Callback):
    """Seed every step from the global step, so a resumed run draws the same CPE crops."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.manual_seed(1000 + trainer.global_step)


class StopAt(pl.Callback):
    """Save a checkpoint after ``step`` steps and stop, as a killed job's last checkpoint."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


class Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def shared_token_source(folder: Path) -> Path:
    """A tiny module with one shared summary token (any number of teachers then fits RADIO's
    layout, the carried ones too), PHI-S fitted, exported in NVlabs' layout."""
    torch.manual_seed(0)
    student = tiny_student(num_registers=2, cpe_align_corners=False)
    module = tiny_module(student=student, teachers=_teachers(), normalizer=PhiS)
    for name, output in module.run_teachers(torch.rand(4, 3, 96, 96)).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    return save_radio(module_inference_model(module.eval()), folder / "shared.pth")


def fit_imported(root: Path, source: Path, *extra, ckpt_path=None, steps: int = 3):
    """The tiny module from ``source`` with a new teacher ``sam2`` (the shipped SAM head is
    carried), trained ``steps`` steps with PHI-S estimated over the first two."""
    torch.manual_seed(0)
    student = tiny_student(num_registers=2, cpe_align_corners=False)
    module = tiny_module(student=student, teachers=_teachers("sam2"), normalizer=PhiS,
                         init_from=str(source))  # fmt: skip
    callbacks = [TeacherStatsEstimation(steps=2, refit_every=1), SeedPerStep(), *extra]
    trainer = cpu_trainer(root, max_steps=steps, callbacks=callbacks)
    trainer.fit(module, image_batches(8, 4), ckpt_path=ckpt_path)
    return module


@pytest.mark.slow
def test_an_imported_run_trains_resumes_exactly_and_exports_old_and_new_heads(tmp_path):
    source = shared_token_source(tmp_path)
    losses = Losses()
    uninterrupted = fit_imported(tmp_path / "full", source, losses)
    assert losses.losses[0] != losses.losses[-1]  # a step moves the loss
    path = tmp_path / "killed.ckpt"
    fit_imported(tmp_path / "first", source, StopAt(2, path))
    resumed = fit_imported(tmp_path / "second", source, ckpt_path=path)
    for key, value in uninterrupted.state_dict().items():
        if not key.startswith("teachers."):
            assert torch.allclose(resumed.state_dict()[key], value, atol=1e-6), key

    teachers = {"clip": TEACHERS["clip"], "dino": TEACHERS["dino"], "sam2": TEACHERS["sam"]}
    student = {**STUDENT, "init_args": {**STUDENT["init_args"], "num_cls_tokens": 1}}
    config = {"model": {"teachers": teachers, "student": student}}
    model = checkpoint_inference_model(saved_run(resumed, tmp_path / "run", config=config))
    save_radio(model, tmp_path / "again.pth")
    _, state = read_radio(source)
    again_config, again = read_radio(tmp_path / "again.pth")
    assert [t["name"] for t in again_config["teachers"]] == ["clip", "dino", "sam2", "sam"]
    assert "_feature_projections.sam2.fc1.weight" in again  # the new head
    for key in [k for k in state if k.startswith(("_heads.sam.", "_feature_projections.sam."))]:
        assert torch.equal(again[key], state[key]), key  # the shipped head, carried untrained
    assert torch.equal(again["input_conditioner.norm_mean"], state["input_conditioner.norm_mean"])


def test_a_student_with_a_token_for_a_new_teacher_extends_the_source(exported):
    """Extending a published model by a teacher with a summary: the student names the
    source's tokens first, then the new one, which starts as a copy of the first (one more
    token to attend to: no longer the source's function to round-off)."""
    from tests.teachers.tiny import tiny_dinov2_teacher

    torch.manual_seed(0)
    names = ["clip", "dino", "sam", "dino2"]
    student = tiny_student(**{**STUDENT["init_args"], "num_cls_tokens": None},
                           summary_tokens=names)  # fmt: skip
    teachers = {**_teachers(), "dino2": tiny_dinov2_teacher()}
    module = tiny_module(student=student, teachers=teachers, normalizer=PhiS,
                         init_from=str(exported / "student.pth")).eval()  # fmt: skip
    _, state = read_radio(exported / "student.pth")
    source = state["base_model.patch_generator.cls_token.token"]
    tokens = module.student.cls_token[0]
    assert torch.equal(tokens[:3], source[:3]) and torch.equal(tokens[3], source[0])
    assert torch.equal(module.student.registers[0], source[3:])
    assert module.imported_heads.names == ["clip", "dino", "sam"]  # dino2's head is fresh


def test_a_published_student_reads_its_architecture_from_the_source(trained, exported):
    """``PublishedStudent`` needs no restated architecture and reproduces the source."""
    source = exported / "student.pth"
    torch.manual_seed(0)
    student = PublishedStudent(source=str(source))
    assert (student.num_cls_tokens, student.num_registers) == (3, 2)
    assert student.summary_tokens == ["clip", "dino", "sam"]
    module = tiny_module(student=student, normalizer=PhiS, init_from=str(source)).eval()
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    want = own_outputs(trained, images)
    del want["backbone"]
    assert_reproduces(outputs_in_teacher_space(module, images), want)
