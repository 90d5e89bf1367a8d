"""The angle-balanced summary loss against the C-RADIOv4 report (2.5, eqs. 3-7, table 3)."""

from __future__ import annotations

import math

import pytest
import torch

from radio_lit.callbacks import TeacherStatsEstimation
from radio_lit.losses import AngleBalanced, AngularDispersion, angle
from tests.builders import cpu_trainer, image_batches, tiny_module

SIGLIP2_G, DINOV3_7B = 0.694, 2.186  # report table 3, rad²


def _cone(mean: torch.Tensor, dispersion: float, count: int, seed: int) -> torch.Tensor:
    """``[count, C]`` summaries at angle ``sqrt(dispersion)`` from ``mean`` (unit), in ± pairs
    of orthogonal directions (so their mean direction is exactly ``mean``), with random
    magnitudes independent of the direction: ``E[Θ(y, μ)²] = dispersion`` exactly."""
    generator = torch.Generator().manual_seed(seed)
    other = torch.randn(count // 2, mean.numel(), generator=generator, dtype=torch.float64)
    other = other - (other @ mean)[:, None] * mean  # orthogonal to the mean
    other = torch.nn.functional.normalize(torch.cat([other, -other]), dim=-1)
    theta = math.sqrt(dispersion)
    unit = math.cos(theta) * mean + math.sin(theta) * other
    scale = torch.rand(count // 2, 1, generator=generator, dtype=torch.float64) * 9 + 1
    scale = scale.repeat(2, 1)  # a pair shares its magnitude: the raw mean is along ``mean``
    return unit * scale


def _mean_direction(dim: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(dim, generator=generator).double(), dim=0)


def test_angle_is_arccos_of_the_cosine_with_a_finite_gradient_at_zero():
    x, y = torch.randn(64, 16, dtype=torch.float64), torch.randn(64, 16, dtype=torch.float64)
    expected = torch.arccos(torch.nn.functional.cosine_similarity(x, y, dim=-1))
    assert torch.allclose(angle(x, y).double(), expected, atol=1e-5)
    # Θ = 0 exactly (a student matching the teacher's direction at another magnitude), and
    # a tiny angle: arccos would give NaN / huge gradients, d Θ² stays finite and -> 0.
    target = torch.randn(4, 16)
    for pred in (3.0 * target, target + 1e-4 * torch.randn(4, 16)):
        pred = pred.clone().requires_grad_(True)
        AngleBalanced()(pred, target, dispersion=torch.tensor(SIGLIP2_G)).backward()
        assert torch.isfinite(pred.grad).all() and pred.grad.abs().max() < 1e-3


def test_loss_is_the_squared_angle_over_the_dispersion():
    pred, target = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])  # 45 degrees
    loss = AngleBalanced()(pred, target, dispersion=torch.tensor(SIGLIP2_G))
    assert loss.item() == pytest.approx((math.pi / 4) ** 2 / SIGLIP2_G, rel=1e-5)
    per_image = AngleBalanced()(pred.repeat(3, 1), target.repeat(3, 1), True, torch.tensor(2.0))
    assert per_image.tolist() == pytest.approx([(math.pi / 4) ** 2 / 2] * 3, rel=1e-5)
    with pytest.raises(ValueError, match="dispersion"):
        AngleBalanced()(pred, target)


@pytest.mark.parametrize("dispersion", [SIGLIP2_G, DINOV3_7B])
def test_estimation_recovers_a_known_angular_spread(dispersion):
    """Streamed over 8 batches of 256, the estimate is the set's E[Θ(y, μ)²]; μ over the raw
    summaries equals μ over the unit ones here (magnitudes independent of directions)."""
    mean = _mean_direction(64, seed=1)
    summaries = _cone(mean, dispersion, 2048, seed=2)
    raw_mean = torch.nn.functional.normalize(summaries.mean(0), dim=0)
    assert torch.allclose(raw_mean, mean, atol=1e-6)
    statistic = AngularDispersion(64)
    for batch in summaries[torch.randperm(2048, generator=torch.Generator().manual_seed(3))].split(
        256
    ):
        statistic.update(batch.float())
    statistic.fit()
    assert statistic.value().item() == pytest.approx(dispersion, rel=0.01)
    direction = torch.nn.functional.normalize(statistic.direction_sum, dim=0)
    assert torch.allclose(direction, mean, atol=1e-5)


def test_the_loss_balances_teachers_of_table_3():
    """A student predicting each teacher's mean direction has expected loss 1 for both
    teachers; a random student does not: about (π/2)² / Disp, i.e. 3.6 and 1.1."""
    random = torch.randn(4096, 64, generator=torch.Generator().manual_seed(4))
    for dispersion, random_loss in ((SIGLIP2_G, 3.56), (DINOV3_7B, 1.13)):
        mean = _mean_direction(64, seed=5)
        summaries = _cone(mean, dispersion, 4096, seed=6).float()
        statistic = AngularDispersion(64)
        statistic.update(summaries)
        statistic.fit()
        loss = AngleBalanced()
        mean_student = mean.float().expand_as(summaries)
        assert loss(mean_student, summaries, dispersion=statistic.value()).item() == (
            pytest.approx(1.0, rel=0.01)
        )
        assert loss(random, summaries, dispersion=statistic.value()).item() == pytest.approx(
            random_loss, rel=0.05
        )


def test_bad_dispersions_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="init_args.dispersion: 'clip' must be"):
        AngleBalanced({"clip": 0.0})
    with pytest.raises(ValueError, match=r"names \['sam'\], which are not teachers with a summary"):
        tiny_module(summary_loss=AngleBalanced({"sam": 1.0}))


def test_module_estimates_checkpoints_and_reloads_the_dispersions(tmp_path):
    """Estimated during TeacherStatsEstimation's steps (a fixed YAML value stays), stored in
    the checkpoint, and a checkpoint written without the loss still loads (strictly)."""
    module = tiny_module(summary_loss=AngleBalanced({"clip": SIGLIP2_G}))
    assert set(module.dispersions) == {"clip", "dino"}  # SAM has no summary
    trainer = cpu_trainer(tmp_path, max_steps=2, callbacks=[TeacherStatsEstimation(steps=2)])
    trainer.fit(module, image_batches())
    assert module.dispersions["clip"].value().item() == SIGLIP2_G
    estimated = module.dispersions["dino"].value().item()
    assert 0.0 < estimated < math.pi**2 and module.dispersions["dino"].count.item() == 8
    trainer.save_checkpoint(tmp_path / "angle.ckpt")
    state = torch.load(tmp_path / "angle.ckpt", weights_only=True)["state_dict"]
    assert state["dispersions.dino.dispersion"].item() == estimated

    resumed = tiny_module(summary_loss=AngleBalanced({"clip": SIGLIP2_G}))
    resumed.load_state_dict(state)
    assert resumed.dispersions["dino"].value().item() == estimated
    old = {k: v for k, v in state.items() if not k.startswith("dispersions.")}
    fresh = tiny_module(summary_loss=AngleBalanced({"clip": SIGLIP2_G}))
    fresh.load_state_dict(old)  # strict: the new state is optional
    assert fresh.dispersions["clip"].value().item() == SIGLIP2_G
    assert not fresh.dispersions["dino"].is_fitted
    with pytest.raises(RuntimeError, match="TeacherStatsEstimation"):
        fresh.dispersions["dino"].value()
