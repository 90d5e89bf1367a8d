"""Which cached view a training epoch reads, and the batches the step receives."""

from __future__ import annotations

import pytest
import torch

from radio_lit.cache import CachedBatch, ViewSampler, collate_views
from radio_lit.data.resumable import SeededSampler


def test_epochs_replay_views_in_the_live_order() -> None:
    items = list(range(10))
    for epoch in range(5):
        live = SeededSampler(items, num_replicas=1, rank=0, seed=3)
        cached = ViewSampler(items, num_replicas=1, rank=0, seed=3, views=2)
        live.set_epoch(epoch)
        cached.set_epoch(epoch)
        assert [i for i, _ in cached] == [i for i, _ in live]  # the live run's order
        assert {view for _, view in cached} == {epoch % 2}  # epoch e reads view e mod V


def test_batches_slice_the_teacher_outputs_like_the_crops() -> None:
    views = [
        {
            "pixels": torch.full((3, 4, 4), i, dtype=torch.uint8),
            "clip/56x56/features": torch.full((2, 2, 8), float(i), dtype=torch.bfloat16),
            "clip/56x56/summary": torch.full((8,), float(i)),
            "sam/64x64/features": torch.full((4, 4, 3), float(i)),
        }
        for i in range(4)
    ]
    batch = collate_views(views)
    assert isinstance(batch, CachedBatch) and len(batch) == 4
    out = batch.teacher_outputs(slice(1, 3), ["clip", "sam"], {"clip": (56, 56), "sam": (64, 64)})
    assert out["clip"].features.dtype == torch.float32  # what a live teacher returns on CPU
    assert out["clip"].features[:, 0, 0, 0].tolist() == [1.0, 2.0]
    assert out["clip"].summary.shape == (2, 8) and out["sam"].summary is None
    with pytest.raises(ValueError, match=r"views at \['56x56'\] pixels, not at 84x84"):
        batch.teacher_outputs(slice(None), ["clip"], {"clip": (84, 84)})
