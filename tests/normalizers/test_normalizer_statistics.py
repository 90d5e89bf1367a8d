"""Streaming statistics: exact merges across batches, chunks and ranks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor

import radio_lit.normalizers.base as base
from radio_lit.normalizers import PhiS, Standardize
from tests.distributed.gloo import run_gloo_workers

F64 = torch.float64
Features = Callable[..., Tensor]
WORKER = Path(__file__).with_name("distributed_worker.py")


def test_streaming_merge_equals_one_pass(features: Features) -> None:
    data = features(2000, 12)
    streamed, one_pass = PhiS(12), PhiS(12)
    for chunk in data.split([1, 2, 17, 300, 1680]):
        streamed.update(chunk)
    one_pass.update(data)
    assert streamed.count.item() == one_pass.count.item() == 2000
    torch.testing.assert_close(streamed.mean, data.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(streamed.covariance(), torch.cov(data.T), rtol=0, atol=1e-12)
    torch.testing.assert_close(one_pass.mean, data.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(one_pass.covariance(), torch.cov(data.T), rtol=0, atol=1e-12)


def test_chunked_update_equals_one_pass(
    features: Features, monkeypatch: pytest.MonkeyPatch
) -> None:
    """update() converts large batches to float64 a chunk at a time; the result is the same."""
    data = features(500, 12).reshape(5, 10, 10, 12)
    whole = PhiS(12)
    whole.update(data)
    monkeypatch.setattr(base, "_CHUNK_ROWS", 7)
    chunked = PhiS(12)
    chunked.update(data)
    assert chunked.count.item() == 500
    torch.testing.assert_close(chunked.mean, whole.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(chunked.m2, whole.m2, rtol=1e-12, atol=1e-9)


def test_per_channel_statistics_match_the_covariance_diagonal(features: Features) -> None:
    data = features(1000, 12)
    full, diagonal = PhiS(12), Standardize(12)
    for chunk in data.split([10, 400, 590]):
        full.update(chunk)
        diagonal.update(chunk)
    assert diagonal.m2.shape == (12,)
    torch.testing.assert_close(diagonal.m2, full.m2.diagonal(), rtol=1e-14, atol=0)
    torch.testing.assert_close(diagonal.mean, full.mean, rtol=0, atol=0)


def test_empty_batch_is_a_no_op(features: Features) -> None:
    normalizer = PhiS(12)
    normalizer.update(features(100, 12))
    state = {k: v.clone() for k, v in normalizer.state_dict().items()}
    normalizer.update(torch.zeros(0, 12))
    assert all(torch.equal(v, normalizer.state_dict()[k]) for k, v in state.items())


@pytest.mark.distributed
def test_all_reduce_over_two_ranks_equals_one_process(tmp_path: Path) -> None:
    """Two gloo ranks with different-sized shards end with identical statistics, equal to
    a single process updated on the union of both shards."""
    results = run_gloo_workers(WORKER, tmp_path)
    union = torch.cat([result["data"] for result in results])
    for name, kind in (("PhiS", PhiS), ("Standardize", Standardize)):
        rank0, rank1 = (result["states"][name] for result in results)
        assert all(torch.equal(rank0[key], rank1[key]) for key in rank0)
        reference = kind(12)
        reference.update(union)
        reference.fit()
        assert rank0["count"].item() == union.shape[0]
        torch.testing.assert_close(rank0["mean"], reference.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(rank0["m2"], reference.m2, rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(rank0["theta"], reference.theta, rtol=1e-9, atol=1e-9)
