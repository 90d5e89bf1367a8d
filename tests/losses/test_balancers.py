"""Loss balancers against their equations (AM-RADIO 3.4.1 and supplement E; UNIC), by hand."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch import nn

from radio_lit.cli.app import RadioLitCLI
from radio_lit.losses import MSE, AdaLoss, Cosine, HybridMSE, TeacherDropping, Uncertainty, Weighted
from tests.builders import cpu_trainer, image_batches, tiny_module

TERMS = {"clip/feature_loss": 1.0, "clip/summary_loss": 2.0, "sam/feature_loss": 0.5}


def _losses(*values: float) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, requires_grad=True) for k, v in zip(TERMS, values, strict=True)}


def test_weighted_is_the_fixed_weight_sum():
    losses = _losses(3.0, 1.0, 4.0)
    assert Weighted(TERMS)(losses).item() == pytest.approx(3.0 + 2.0 + 2.0)
    weights = Weighted(TERMS).effective_weights()
    assert {k: w.item() for k, w in weights.items()} == TERMS


def _step(balancer: AdaLoss, losses: dict[str, torch.Tensor]) -> torch.Tensor:
    """One training step of one chunk: observe the terms, then combine them."""
    balancer.observe([losses], [1.0])
    return balancer(losses)


def test_adaloss_divides_each_term_by_its_detached_moving_average():
    balancer = AdaLoss(TERMS, momentum=0.5)
    assert AdaLoss(TERMS).momentum == 0.99  # AM-RADIO 3.4.1
    # Step 1: the averages start at the first values, so every term is its fixed weight.
    assert _step(balancer, _losses(2.0, 4.0, 8.0)).item() == pytest.approx(1.0 + 2.0 + 0.5)
    # Step 2: averages 0.5 * 2 + 0.5 * 4 = 3, 0.5 * 4 + 0.5 * 4 = 4, 0.5 * 8 + 0.5 * 0 = 4.
    losses = _losses(4.0, 4.0, 0.0)
    total = _step(balancer, losses)
    assert total.item() == pytest.approx(4 / 3 + 2 * 4 / 4 + 0.0)
    total.backward()  # the average is a constant: d total / d L = w / E[L]
    assert losses["clip/feature_loss"].grad.item() == pytest.approx(1 / 3)
    assert losses["sam/feature_loss"].grad.item() == pytest.approx(0.5 / 4)
    weights = balancer.effective_weights()
    assert [w.item() for w in weights.values()] == pytest.approx([1 / 3, 2 / 4, 0.5 / 4])
    # Validation uses the averages without changing them; absent terms keep theirs.
    assert balancer({"clip/feature_loss": torch.tensor(6.0)}).item() == pytest.approx(2.0)
    _step(balancer, {"clip/feature_loss": torch.tensor(5.0)})
    assert balancer.average.tolist() == pytest.approx([4.0, 4.0, 4.0])


def test_adaloss_is_finite_before_its_first_update():
    """A validation (or sanity) step before any training step: each term weighs w_t, as on
    the first training step, instead of dividing by ~1e-38."""
    total = AdaLoss(TERMS)(_losses(2.0, 4.0, 8.0))
    assert total.item() == pytest.approx(1.0 + 2.0 + 0.5)
    assert AdaLoss(TERMS)(_losses(0.0, 0.0, 0.0)).item() == 0.0


def test_adaloss_updates_once_per_step_and_one_rank_equals_two():
    """A teacher in two partitions of one rank (chunk values a and b each step) gets one
    update per step with the mean (a + b) / 2, what two ranks with one chunk each average.
    Momentum 0.9, three steps of (a, b) = (1, 5), (2, 4), (3, 1): averages 3, 3.0, 2.9 by
    hand, against 1.76 if each chunk updated the average in turn."""
    balancer = AdaLoss({"dino/feature_loss": 1.0}, momentum=0.9)
    for a, b in [(1.0, 5.0), (2.0, 4.0), (3.0, 1.0)]:
        chunks = [{"dino/feature_loss": torch.tensor(a)}, {"dino/feature_loss": torch.tensor(b)}]
        balancer.observe(chunks, [1.0, 1.0])
    assert balancer.average.item() == pytest.approx(2.9)
    # A partition split over two ranks counts 1/2 on each: its two halves are one partition.
    halves = AdaLoss({"dino/feature_loss": 1.0}, momentum=0.9)
    halves.observe([{"dino/feature_loss": torch.tensor(2.0)}] * 2, [0.5, 0.5])
    halves.observe([{"dino/feature_loss": torch.tensor(6.0)}], [1.0])
    assert halves.average.item() == pytest.approx(0.9 * 2.0 + 0.1 * 6.0)


def test_uncertainty_is_am_radio_eq_6_and_trains_through_the_optimizer():
    balancer = Uncertainty(TERMS)
    # b = 0: weights 1 (times the fixed weight) plus softplus(0) = ln 2 per term.
    assert balancer(_losses(3.0, 1.0, 4.0)).item() == pytest.approx(7.0 + 3 * math.log(2))
    with torch.no_grad():
        balancer.log_variance.copy_(torch.tensor([math.log(2), 0.0, -math.log(3)]))
    losses = _losses(3.0, 1.0, 4.0)
    total = balancer(losses)
    expected = (0.5 * 3 + math.log(3)) + (2 * 1 + math.log(2)) + (0.5 * 3 * 4 + math.log(4 / 3))
    assert total.item() == pytest.approx(expected)
    total.backward()
    # d/db [w e^-b L + softplus(b)] = -w e^-b L + sigmoid(b)
    assert balancer.log_variance.grad.tolist() == pytest.approx(
        [-0.5 * 3 + 2 / 3, -2 * 1 + 0.5, -0.5 * 3 * 4 + 0.25]
    )
    weights = balancer.effective_weights()
    assert [w.item() for w in weights.values()] == pytest.approx([0.5, 2.0, 1.5])


def test_uncertainty_ignores_terms_with_zero_weight():
    balancer = Uncertainty({"a/feature_loss": 1.0, "b/feature_loss": 0.0})
    total = balancer({"a/feature_loss": torch.tensor(2.0), "b/feature_loss": torch.tensor(9.0)})
    assert total.item() == pytest.approx(2.0 + math.log(2))


def test_teacher_dropping_keeps_the_hardest_teacher_of_each_image():
    terms = {"a/feature_loss": 1.0, "a/summary_loss": 1.0, "b/feature_loss": 2.0}
    # Per image and teacher: a = [1 + 0, 2 + 3] = [1, 5], b = 2 * [1.5, 1] = [3, 2].
    losses = {
        "a/feature_loss": torch.tensor([1.0, 2.0]),
        "a/summary_loss": torch.tensor([0.0, 3.0]),
        "b/feature_loss": torch.tensor([1.5, 1.0]),
    }
    everything = TeacherDropping(terms, p=0.0)
    weighted = Weighted(terms)({k: v.mean() for k, v in losses.items()})
    assert everything(losses).item() == pytest.approx(weighted.item())  # (1+5)/2 + (3+2)/2
    hardest_only = TeacherDropping(terms, p=1.0)
    # Kept: b for image 0 (3 > 1), a for image 1 (5 > 2): 2 teachers * (3 + 5) / 2 kept pairs.
    assert hardest_only(losses).item() == pytest.approx(8.0)
    weights = hardest_only.effective_weights()
    assert [w.item() for w in weights.values()] == pytest.approx([1.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="same images"):
        hardest_only({"a/feature_loss": torch.ones(2), "b/feature_loss": torch.ones(3)})


def test_teacher_dropping_draws_from_the_global_rng_in_training_only():
    terms = {"a/feature_loss": 1.0, "b/feature_loss": 1.0, "c/feature_loss": 1.0}
    images = 20_000
    losses = {
        k: torch.rand(images, generator=torch.Generator().manual_seed(i))
        for i, k in enumerate(terms)
    }
    hardest = torch.stack(list(losses.values())).argmax(0)
    balancer = TeacherDropping(terms)  # p = 0.5

    torch.manual_seed(7)
    first = balancer(losses)
    kept = balancer.effective_weights()
    torch.manual_seed(7)
    assert torch.equal(balancer(losses), first)  # seeded runs reproduce
    # Each teacher is kept for the images where it is hardest, and for half of the others.
    for k, key in enumerate(terms):
        share = (hardest == k).float().mean().item()
        fraction = share + 0.5 * (1 - share)
        total_kept = (1 + 2 * 0.5) / 3  # per image: the hardest plus half of the 2 others
        assert kept[key].item() == pytest.approx(fraction / total_kept, rel=0.03)

    balancer.eval()
    state = torch.get_rng_state()
    assert balancer(losses).item() == pytest.approx(sum(v.mean().item() for v in losses.values()))
    assert torch.equal(torch.get_rng_state(), state)


def test_losses_per_image_average_to_the_scalar_loss():
    pred = torch.tensor([[[1.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 3.0]]])  # [B=2, 2, C=2]
    target = torch.zeros_like(pred)
    assert MSE()(pred, target, per_sample=True).tolist() == pytest.approx([5 / 4, 9 / 4])
    torch.manual_seed(0)
    pred, target = torch.randn(3, 4, 4, 8), torch.randn(3, 4, 4, 8)
    for loss in (MSE(), Cosine(), HybridMSE()):
        per_image = loss(pred, target, per_sample=True)
        assert per_image.shape == (3,)
        assert per_image.mean().item() == pytest.approx(loss(pred, target).item(), rel=1e-6)
    summary = Cosine()(pred[:, 0, 0], target[:, 0, 0], per_sample=True)
    assert summary.shape == (3,)


def test_bad_balancer_options_name_the_key():
    with pytest.raises(ValueError, match="momentum"):
        AdaLoss(TERMS, momentum=1.0)
    with pytest.raises(ValueError, match="init_args.p"):
        TeacherDropping(TERMS, p=1.5)
    with pytest.raises(ValueError, match="model.feature_weights"):
        tiny_module(feature_weights={"sam": -1.0})
    with pytest.raises(ValueError, match="model.loss"):
        tiny_module(balancer=TeacherDropping, loss=nn.MSELoss())


def test_module_builds_the_balancer_from_its_terms_and_weights():
    module = tiny_module(balancer=Uncertainty, feature_weights={"sam": 0.5})
    assert module.balancer.terms == {
        "clip/feature_loss": 1.0,
        "clip/summary_loss": 1.0,
        "dino/feature_loss": 1.0,
        "dino/summary_loss": 1.0,
        "sam/feature_loss": 0.5,
    }
    names = [name for name, _ in module.trainable_parameters()]
    assert "balancer.log_variance" in names


def test_cli_selects_a_balancer_with_options(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["radio-lit"])
    config = "configs/quickstart.yaml"
    args = ["--config", config, "--model.balancer", "radio_lit.losses.AdaLoss"]
    cli = RadioLitCLI(args=[*args, "--model.balancer.momentum", "0.9"], run=False)
    assert isinstance(cli.model.balancer, AdaLoss)
    assert cli.model.balancer.momentum == 0.9
    assert set(cli.model.balancer.terms) >= {"clip/summary_loss", "sam/feature_loss"}


def test_balancer_state_is_trained_checkpointed_and_restored(tmp_path):
    """Uncertainty's parameters move with the optimizer; AdaLoss's averages are saved."""
    module = tiny_module(balancer=Uncertainty)
    trainer = cpu_trainer(tmp_path, max_steps=2)
    trainer.fit(module, image_batches())
    learned = module.balancer.log_variance.detach().clone()
    assert not torch.equal(learned, torch.zeros_like(learned))
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)["state_dict"]
    restored = tiny_module(balancer=Uncertainty)
    restored.load_state_dict(state)
    assert torch.equal(restored.balancer.log_variance, learned)

    averaging = tiny_module(balancer=AdaLoss)
    averaging.balancer.observe([{"clip/feature_loss": torch.tensor(3.0)}], [1.0])
    resumed = tiny_module(balancer=AdaLoss)
    resumed.load_state_dict(averaging.state_dict())
    assert resumed.balancer.average[0].item() == 3.0 and bool(resumed.balancer.seen[0])
    assert not any(k.startswith("metrics.") for k in state)  # metric states are not saved
