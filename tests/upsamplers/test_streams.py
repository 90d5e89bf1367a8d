"""FeatSharp's jittered views and logit dropout come from per-rank streams: on N ranks each
rank draws its own views and masks (not the one set ``seed_everything`` gives every rank's
global generators), and a checkpoint brings each rank's streams back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.gloo import run_gloo_workers


@pytest.mark.distributed
def test_two_ranks_draw_their_own_views_and_dropout(tmp_path: Path):
    """Two gloo ranks, the same module, seed and images: different views, matrices and
    dropout masks; the global generators untouched; a checkpoint holds both ranks' streams,
    and each rank restored from it draws exactly what it drew next without the restart."""
    worker = Path(__file__).parent / "streams_worker.py"
    rank0, rank1 = run_gloo_workers(worker, tmp_path)
    for name in ("first", "second"):
        for drawn0, drawn1 in zip(rank0[name], rank1[name], strict=True):
            assert not torch.equal(drawn0, drawn1)  # views, matrices, dropout: per rank
    assert not torch.equal(rank0["first"][1], rank0["second"][1])  # a fresh draw per step
    for result in (rank0, rank1):
        assert result["global"]
        assert len(result["ranks"]) == 2  # both ranks' states in the checkpoint
        for drawn, again in zip(result["second"], result["again"], strict=True):
            assert torch.equal(drawn, again)
