"""Streaming statistics: exact merges across batches, chunks and ranks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor

import radio_lit.normalizers.base as base
from benchmarks.dispatch import ScalarReads
from radio_lit.core.outputs import TeacherOutput
from radio_lit.losses.angular import AngularDispersion
from radio_lit.normalizers import PhiS, Standardize
from radio_lit.normalizers.statistics import accumulate_outputs
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


# -- masked statistics (a shifted view's valid tokens) with no host read ----------------------


def _shifted_outputs(features: Features) -> list[dict[str, TeacherOutput]]:
    """Two chunks of one step: a shifted teacher, whose ``valid`` tokens leave out the rows
    its shift moved off the image, and an unshifted one."""
    out = []
    for seed, (batch, (h, w), cut) in enumerate(((3, (5, 6), 2), (2, (4, 4), 1))):
        valid = torch.ones(batch, h, w, dtype=torch.bool)
        valid[:, :cut] = False  # the rows the view's shift moved off the image
        chunk = {
            "shifted": TeacherOutput(
                summary=features(batch, 4, seed),
                features=features(batch * h * w, 12, seed).reshape(batch, h, w, 12),
                valid=valid,
            ),
            "plain": TeacherOutput(
                summary=None, features=features(batch * h * w, 8, seed).reshape(batch, h, w, 8)
            ),
        }
        out.append(chunk)
    return out


def test_masked_statistics_equal_those_of_the_valid_tokens(
    features: Features, monkeypatch: pytest.MonkeyPatch
) -> None:
    """update(x, mask) holds the statistics of x[mask] (masked sums and counts; chunked too)."""
    data = features(600, 12).reshape(6, 10, 10, 12)
    mask = torch.rand(6, 10, 10, generator=torch.Generator().manual_seed(3)) > 0.3
    for rows in (base._CHUNK_ROWS, 7):
        monkeypatch.setattr(base, "_CHUNK_ROWS", rows)
        for kind in (PhiS, Standardize):
            masked, reference = kind(12), kind(12)
            masked.update(data[:1])
            reference.update(data[:1])
            masked.update(data, mask)
            reference.update(data[mask])
            assert masked.count.item() == reference.count.item() == 100 + int(mask.sum())
            torch.testing.assert_close(masked.mean, reference.mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(masked.m2, reference.m2, rtol=1e-12, atol=1e-9)


def test_a_mask_of_another_shape_is_one_line(features: Features) -> None:
    with pytest.raises(
        ValueError, match=r"the mask \(2, 3, 1\) must have the features. leading shape \(2, 3\)"
    ):
        PhiS(12).update(features(6, 12).reshape(2, 3, 12), torch.ones(2, 3, 1, dtype=torch.bool))


def test_an_estimation_step_reads_nothing_from_the_device(features: Features) -> None:
    """accumulate_outputs (every estimation step of a stage, each teacher) takes a shifted
    view's valid tokens as a mask: no boolean index, whose size a GPU would read back."""
    outputs = _shifted_outputs(features)
    names = ("shifted", "plain")
    normalizers = {"shifted": PhiS(12), "plain": PhiS(8)}
    dispersions = {"shifted": AngularDispersion(4)}
    with ScalarReads() as reads:
        for normalizer in [*normalizers.values(), *dispersions.values()]:
            reads.track(*normalizer.buffers())
        for chunk in outputs:
            for output in chunk.values():
                reads.track(
                    output.features, *(t for t in (output.summary, output.valid) if t is not None)
                )
        accumulate_outputs(normalizers, dispersions, outputs, refit=False, sources={})
    assert reads.device_syncs == []
    for name in names:  # the statistics of the tokens each view saw, as float32 features
        seen = [c[name] for c in outputs]
        rows = [o.features if o.valid is None else o.features[o.valid] for o in seen]
        reference = PhiS(normalizers[name].dim)
        reference.update(torch.cat([r.float().reshape(-1, reference.dim) for r in rows]))
        for buffer in ("count", "mean", "m2"):
            got, expected = getattr(normalizers[name], buffer), getattr(reference, buffer)
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-9)
    assert normalizers["shifted"].count.item() == 3 * 3 * 6 + 2 * 3 * 4


def test_the_boolean_index_it_replaces_is_counted_as_a_read(features: Features) -> None:
    """The counter the test above relies on sees a boolean-mask index of a device tensor."""
    output = _shifted_outputs(features)[0]["shifted"]
    with ScalarReads() as reads:
        reads.track(output.features, output.valid)
        PhiS(12).update(output.features[output.valid])
    assert len(reads.device_syncs) == 1
