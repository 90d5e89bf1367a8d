"""DistillationModule: the training step, heads, checkpoints, init_from and clear errors."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from radio_lit.data.views import teacher_view
from radio_lit.geometry.grid import resample
from radio_lit.losses import MSE
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS, Standardize
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student
from tests.teachers.tiny import tiny_clip_teacher, tiny_dinov2_teacher


def test_heads_follow_am_radio_3_2():
    module = tiny_module()
    widest = max(max(t.feature_dim, t.summary_dim or 0) for t in module.teachers.values())
    for name, teacher in module.teachers.items():
        heads = module.heads[name]
        assert heads.features.inp.in_features == module.student.embed_dim
        assert heads.features.inp.out_features == widest
        assert heads.features.out.out_features == teacher.feature_dim
        if teacher.summary_dim is None:
            assert heads.summary is None  # SAM: no summary head, no summary loss
        else:
            assert heads.summary.out.out_features == teacher.summary_dim


def test_losses_cover_every_teacher_and_skip_sam_summary():
    module = tiny_module()
    crop = torch.rand(2, 3, 96, 96)
    outputs = module.run_teachers(crop)
    losses = module.distillation_losses(
        module.match(crop, outputs, module.normalized_targets([outputs])[0])
    )
    assert set(losses) == {
        "clip/feature_loss",
        "clip/summary_loss",
        "dino/feature_loss",
        "dino/summary_loss",
        "sam/feature_loss",
    }
    assert all(torch.isfinite(v) for v in losses.values())


def test_feature_loss_compares_the_student_map_resized_to_the_teacher_grid():
    module = tiny_module(loss=MSE())
    crop = torch.rand(2, 3, 96, 96)
    outputs = module.run_teachers(crop)
    (targets,) = module.normalized_targets([outputs])
    module.student.eval()  # deterministic CPE for the reference computation
    losses = module.distillation_losses(module.match(crop, outputs, targets))
    student = module.student(teacher_view(crop, 64, *module.conditioner.values))
    for name, target in targets.items():
        grid = module.teachers[name].grid_size
        assert target.shape[1:3] == grid
        prediction = resample(module.heads[name].features(student.features), grid)
        expected = torch.mean((prediction - target) ** 2)
        assert losses[f"{name}/feature_loss"].item() == pytest.approx(expected.item(), rel=1e-4)


def test_weights_scale_each_teacher_term():
    module = tiny_module(feature_weights={"sam": 0.0}, summary_weights={"clip": 2.0})
    losses = {
        "clip/feature_loss": torch.tensor(1.0),
        "clip/summary_loss": torch.tensor(1.0),
        "sam/feature_loss": torch.tensor(5.0),
    }
    assert module.balancer(losses).item() == pytest.approx(3.0)


def test_normalizer_kind_applies_to_every_teacher_with_overrides():
    module = tiny_module(normalizer=PhiS, normalizer_overrides={"sam": Standardize})
    assert isinstance(module.normalizers["clip"], PhiS)
    assert isinstance(module.normalizers["dino"], PhiS)
    assert isinstance(module.normalizers["sam"], Standardize)
    assert module.normalizers["clip"].dim == module.teachers["clip"].feature_dim
    assert module.normalizers["clip"] is not module.normalizers["dino"]


def test_bad_configuration_names_the_problem():
    with pytest.raises(ValueError, match="unknown teachers \\['siglip'\\]"):
        tiny_module(feature_weights={"siglip": 1.0})
    with pytest.raises(ValueError, match="summary tokens"):
        tiny_module(student=tiny_student(num_cls_tokens=4))
    with pytest.raises(ValueError, match="at least one teacher"):
        tiny_module(teachers={})
    with pytest.raises(FileNotFoundError, match="init_from"):
        tiny_module(init_from="/nonexistent/stage1.ckpt")


def test_one_summary_token_per_teacher():
    module = tiny_module(student=tiny_student(num_cls_tokens=2))
    assert module.summary_token == {"clip": 0, "dino": 1}


def test_one_summary_token_per_teacher_in_radio_layout():
    """NVlabs/RADIO's layout: teacher i reads token i; SAM's token (no summary) is unused."""
    module = tiny_module(student=tiny_student(num_cls_tokens=3))
    assert module.summary_token == {"clip": 0, "dino": 1}


def test_optimizer_sees_only_student_and_heads(tmp_path):
    module = tiny_module()
    cpu_trainer(tmp_path, max_steps=1).fit(module, image_batches())
    optimizer = module.trainer.optimizers[0]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for _, p in module.trainable_parameters()}
    assert not any(id(p) in optimized for p in module.teachers.parameters())
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert list(groups) == ["trunk_decay", "trunk_no_decay", "heads_decay", "heads_no_decay"]
    assert groups["trunk_no_decay"]["weight_decay"] == groups["heads_no_decay"]["weight_decay"] == 0
    assert any(p is module.student.pos_embed for p in groups["trunk_no_decay"]["params"])
    trunk = {id(p) for p in module.student.parameters()}
    for name, group in groups.items():
        assert all((id(p) in trunk) == name.startswith("trunk") for p in group["params"]), name


def test_teachers_stay_frozen_and_untouched_by_training(tmp_path):
    module = tiny_module()
    before = {k: v.clone() for k, v in module.teachers["dino"].model.state_dict().items()}
    cpu_trainer(tmp_path, max_steps=2).fit(module, image_batches())
    assert not module.teachers["dino"].training
    for key, value in module.teachers["dino"].model.state_dict().items():
        assert torch.equal(value, before[key])


def test_warmup_then_cosine_schedule(tmp_path):
    module = tiny_module(warmup_steps=2)
    lrs = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    cpu_trainer(tmp_path, max_steps=6, callbacks=[Record()]).fit(module, image_batches(16, 2))
    assert lrs[:3] == pytest.approx([0.5e-3, 1e-3, 1e-3])  # linear warm-up to the peak
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:], strict=False))  # then cosine decay
    assert lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 3 / 4)))


def test_checkpoint_excludes_teachers_and_resumes_at_the_same_step(tmp_path):
    module = tiny_module()
    first = cpu_trainer(tmp_path, max_steps=3)
    first.fit(module, image_batches())
    path = tmp_path / "run.ckpt"
    first.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    assert not any(k.startswith("teachers.") for k in state)
    assert any(k.startswith("student.") for k in state)

    seen = {}

    class AtStart(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["step"] = trainer.global_step
            seen["weights"] = {k: v.clone() for k, v in pl_module.student.state_dict().items()}

    resumed = tiny_module()
    cpu_trainer(tmp_path, max_steps=5, callbacks=[AtStart()]).fit(
        resumed, image_batches(), ckpt_path=path
    )
    assert seen["step"] == 3
    for key, value in seen["weights"].items():
        assert torch.equal(value, state[f"student.{key}"]), key
    assert resumed.trainer.global_step == 5


class _StrictScale(torch.nn.Module):
    """A LayerScale that, as NVlabs' ``radio/dinov2_arch.py`` ``LayerScale`` does, raises in
    ``_load_from_state_dict`` when the state holds neither ``gamma`` nor ``grandma``, whatever
    ``strict`` (a RADIO teacher built by NVlabs' code: C-RADIOv3-B/L, RADIOv2.5-B/L)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.grandma = torch.nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.grandma

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "gamma" not in state_dict and prefix + "grandma" not in state_dict:
            raise KeyError(f"Couldn't find the key {prefix}gamma nor {prefix}grandma")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def test_a_teacher_whose_loading_needs_its_keys_keeps_its_weights(tmp_path):
    """Teacher weights are not checkpointed; a later stage (``init_from: last.ckpt``) and a
    resumed run load the checkpoint into the whole module, where a teacher module that
    raises on a missing key (NVlabs' LayerScale) gets its own weights back."""
    stage1 = tiny_module()
    block = stage1.teachers["dino"].model.blocks[0]
    block.ls1 = _StrictScale(block.norm1.normalized_shape[0])
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": stage1.state_dict()}, path)
    assert not any(k.startswith("teachers.") for k in stage1.state_dict())
    before = {k: v.clone() for k, v in torch.nn.Module.state_dict(stage1.teachers["dino"]).items()}
    stage1.load_state_dict(torch.load(path)["state_dict"], strict=True)  # as a resume does
    after = torch.nn.Module.state_dict(stage1.teachers["dino"])
    assert before.keys() == after.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(block.ls1.grandma, torch.full_like(block.ls1.grandma, 0.5))


def test_init_from_takes_student_and_heads_only(tmp_path):
    stage1 = tiny_module(normalizer=PhiS)
    stage1.normalizers["clip"].update(torch.randn(64, stage1.teachers["clip"].feature_dim))
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": stage1.state_dict()}, path)

    stage2 = tiny_module(normalizer=PhiS, init_from=str(path), student_resolution=96)
    for key, value in stage1.student.state_dict().items():
        assert torch.equal(stage2.student.state_dict()[key], value)
    for key, value in stage1.heads.state_dict().items():
        assert torch.equal(stage2.heads.state_dict()[key], value)
    assert stage2.normalizers["clip"].count.item() == 0  # fresh statistics


def test_init_from_lets_a_teacher_join_in_a_later_stage(tmp_path):
    """AM-RADIO 4: stage 1 distills CLIP + DINOv2, stage 2 adds SAM; SAM's heads start fresh."""
    stage1 = tiny_module(teachers={"clip": tiny_clip_teacher(), "dino": tiny_dinov2_teacher()})
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": stage1.state_dict()}, path)

    torch.manual_seed(1)
    stage2 = tiny_module(init_from=str(path))
    for key, value in stage1.student.state_dict().items():
        assert torch.equal(stage2.student.state_dict()[key], value)
    for key, value in stage1.heads.state_dict().items():
        assert torch.equal(stage2.heads.state_dict()[key], value)
    torch.manual_seed(1)
    assert torch.equal(
        stage2.heads["sam"].features.out.weight, tiny_module().heads["sam"].features.out.weight
    )
    with pytest.raises(ValueError, match="teachers may only be added"):
        torch.save({"state_dict": stage2.state_dict()}, path)
        tiny_module(teachers={"clip": tiny_clip_teacher()}, init_from=str(path))


def test_init_from_a_different_architecture_is_a_clear_error(tmp_path):
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": tiny_module().state_dict()}, path)
    wider = tiny_student(model_kwargs=dict(depth=3, embed_dim=32, num_heads=2))
    with pytest.raises(ValueError, match="does not match"):
        tiny_module(student=wider, init_from=str(path))


def test_predict_returns_estimates_in_the_teacher_space(tmp_path):
    module = tiny_module(normalizer=Standardize)
    crop = torch.rand(4, 3, 96, 96)
    for name, output in module.run_teachers(crop).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    module.eval()
    estimates = module.predict_step((crop * 255).to(torch.uint8), 0)
    assert set(estimates) == {"backbone", *module.teachers}
    for name in module.teachers:
        estimate, normalizer = estimates[name], module.normalizers[name]
        view = teacher_view(crop, 64, *module.conditioner.values)
        normalized = module.heads[name].features(module.student(view).features)
        assert estimate.features.shape[-1] == module.teachers[name].feature_dim
        assert estimate.features.shape[1:3] == normalized.shape[1:3]
    # The estimate is the denormalized head output: normalizing it again gives the head output.
    name = "sam"
    assert estimates[name].summary is None
    assert torch.allclose(
        normalizer.inverse(normalizer(estimates[name].features)),
        estimates[name].features,
        atol=1e-4,
    )


def test_unfitted_statistics_without_the_callback_is_a_clear_error(tmp_path):
    module = tiny_module(normalizer=PhiS)
    with pytest.raises(RuntimeError, match="TeacherStatsEstimation"):
        cpu_trainer(tmp_path, max_steps=1).fit(module, image_batches())


def test_subclass_of_module_is_loadable_from_checkpoint_hyperparameters():
    module = tiny_module()
    assert "student" not in module.hparams and "teachers" not in module.hparams
    assert isinstance(module, DistillationModule)


def test_teachers_sharing_a_resolution_share_one_resize_and_match_their_own_views():
    module = tiny_module()
    assert module.teachers["clip"].resolution == module.teachers["dino"].resolution
    crop = torch.rand(2, 3, 96, 96)
    for name, output in module.run_teachers(crop).items():
        alone = module.teachers[name](crop)
        assert torch.equal(output.features, alone.features), name
