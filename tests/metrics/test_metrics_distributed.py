"""Metrics and AdaLoss's averages on 2 gloo processes equal one process on all the data."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radio_lit.metrics import DistillationMetrics
from radio_lit.normalizers import Identity, Normalizer, Standardize
from radio_lit.training.matching import TeacherMatch
from tests.distributed.gloo import run_gloo_workers

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("distributed_worker.py")
TEACHERS = {
    "a": SimpleNamespace(feature_dim=6, summary_dim=4),
    "b": SimpleNamespace(feature_dim=3, summary_dim=None),
}
TERMS = {"a/feature_loss": 1.0, "a/summary_loss": 1.0, "b/feature_loss": 1.0}


def normalizers(data: dict[str, Any]) -> dict[str, Normalizer]:
    a = Standardize(6)
    a.load_state_dict(data["normalizer"])
    return {"a": a, "b": Identity(3)}


def _match(generator: torch.Generator, batch: int, dim: int, summary: bool) -> dict[str, Any]:
    target = torch.randn(batch, 2, 3, dim, generator=generator) * 3 + 1
    match = {"features": target + torch.randn(target.shape, generator=generator), "target": target}
    if summary:
        match["summary"] = torch.randn(batch, 4, generator=generator)
        match["summary_target"] = torch.randn(batch, 4, generator=generator)
    return match


def test_metrics_agree_between_one_and_two_processes(tmp_path):
    generator = torch.Generator().manual_seed(0)
    a = Standardize(6)
    a.update(torch.randn(500, 6, generator=generator) * torch.arange(1.0, 7.0) + 5)
    a.fit()
    # Rank 0: three batches of both teachers; rank 1: two batches of "a" only (as a rank of
    # another partition would), of other sizes.
    batches = [
        [
            {"a": _match(generator, n, 6, True), "b": _match(generator, n, 3, False)}
            for n in (1, 4, 2)
        ],
        [{"a": _match(generator, n, 6, True)} for n in (5, 3)],
    ]
    losses = [
        {"a/feature_loss": torch.tensor(2.0), "b/feature_loss": torch.tensor(6.0)},
        {"a/feature_loss": torch.tensor(4.0)},
    ]
    source = tmp_path / "input.pt"
    data = {"normalizer": a.state_dict(), "batches": batches, "losses": losses}
    torch.save(data, source)

    results = run_gloo_workers(WORKER, tmp_path, str(source))

    single = DistillationMetrics(TEACHERS)
    for batch in [*batches[0], *batches[1]]:
        single.update({name: TeacherMatch(**m) for name, m in batch.items()}, normalizers(data))
    expected = single.compute()
    assert set(expected) == set(results[0]["values"]) == set(results[1]["values"])
    for key, value in expected.items():
        for result in results:
            torch.testing.assert_close(result["values"][key], value, rtol=1e-9, atol=0, msg=key)

    # AdaLoss: the first step's average is the term's mean over the ranks that computed it.
    for result in results:
        assert result["average"].tolist() == [3.0, 0.0, 6.0]
        assert result["seen"].tolist() == [True, False, True]
