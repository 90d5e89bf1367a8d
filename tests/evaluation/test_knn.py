"""kNN classification through the summary (AM-RADIO 3.1; NVlabs/RADIO knn_classification.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radio_lit.evaluation import KNNClassification, knn_votes
from tests.distributed.gloo import run_gloo_workers
from tests.evaluation.synthetic import dataset_root, mean_color_view, overlapping_root

WORKER = Path(__file__).with_name("knn_worker.py")


def test_votes_are_weighted_by_exp_similarity_over_temperature():
    """Hand-worked: two class-0 neighbours (cosine 0.9, 0.1) against one class-1 neighbour
    (0.95). A majority vote says 0; the weights exp(s / 0.07) say 1 (e^13.57 > e^12.86 + e^1.43)."""
    angles = torch.tensor([math.acos(0.9), math.acos(0.1), -math.acos(0.95), math.pi])
    bank = torch.stack([angles.cos(), angles.sin()], dim=1)
    labels = torch.tensor([0, 0, 1, 1])
    query = torch.tensor([[1.0, 0.0]])
    votes = knn_votes(bank, labels, query, num_classes=2, k=3)
    expected = torch.tensor([[math.exp(0.9 / 0.07) + math.exp(0.1 / 0.07), math.exp(0.95 / 0.07)]])
    torch.testing.assert_close(votes, expected, rtol=1e-5, atol=0)
    assert votes.argmax().item() == 1


def test_separable_classes_reach_100_percent(tmp_path):
    train, evaluation = dataset_root(tmp_path)
    measure = KNNClassification(str(train), str(evaluation), crop_size=32, k=20)
    assert measure.evaluate(mean_color_view()).scalars == {"eval/knn/backbone/top1": 100.0}


def test_shuffled_labels_are_near_chance():
    generator = torch.Generator().manual_seed(0)
    bank = F.normalize(torch.randn(4000, 16, generator=generator), dim=1)
    queries = F.normalize(torch.randn(2000, 16, generator=generator), dim=1)
    labels = torch.randint(0, 10, (4000,), generator=generator)
    truth = torch.randint(0, 10, (2000,), generator=generator)
    accuracy = (knn_votes(bank, labels, queries, 10).argmax(1) == truth).float().mean().item()
    assert 0.07 < accuracy < 0.13  # chance is 0.10; 3 standard errors are 0.02


def test_an_evaluation_class_missing_from_training_is_an_error(tmp_path):
    train, evaluation = dataset_root(tmp_path)
    (evaluation / "purple").mkdir()
    (evaluation / "red" / "0.png").rename(evaluation / "purple" / "0.png")
    with pytest.raises(ValueError, match="purple"):
        KNNClassification(str(train), str(evaluation), crop_size=32).evaluate(mean_color_view())


@pytest.mark.distributed
def test_two_gloo_ranks_give_the_accuracy_of_one_process(tmp_path):
    train, evaluation = overlapping_root(tmp_path)
    single = KNNClassification(str(train), str(evaluation), crop_size=32, batch_size=5, k=5)
    expected = single.evaluate(mean_color_view()).scalars["eval/knn/backbone/top1"]
    assert 40.0 < expected < 100.0  # the classes overlap: the test can tell shards apart

    results = run_gloo_workers(WORKER, tmp_path, str(train), str(evaluation))
    for result in results:
        assert result["eval/knn/backbone/top1"] == pytest.approx(expected, abs=1e-4)
