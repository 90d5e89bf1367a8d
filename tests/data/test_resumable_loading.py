"""The training loaders continue exactly where a checkpoint stopped them.

A loader is read for a few batches, its state taken as Lightning takes it for a checkpoint,
and a brand-new loader (as in a resumed process) restored from that state must yield what the
original yields next: same samples, same random crops, for the image folder and the
webdataset shards, with 0 and 2 workers, on each of 2 ranks, mid-epoch and at an epoch end;
also for a rank that loads only the first rows of each batch (``use_rows``: its partitions'
share), whose batches must be those rows of the whole batches.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radio_lit.data import ImageFolderDataModule, WebDatasetDataModule
from radio_lit.data.image_folder import SAMPLE_IMAGES
from radio_lit.data.resumable import sample_seed, seeded


class Rank:
    """The bits of a Trainer a datamodule's train_dataloader reads."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.global_rank, self.world_size = rank, world_size


def loader(make, rank: int, world_size: int, rows: int | None = None):
    datamodule = make()
    datamodule.trainer = Rank(rank, world_size)
    datamodule.setup("fit")
    datamodule.use_rows(rows)  # as the model's setup does, after the datamodule's
    return datamodule.train_dataloader()


def epochs(dataloader, first: int, count: int, stop_after: int | None = None):
    """Batches of ``count`` epochs from epoch ``first``; the state after ``stop_after`` batches."""
    batches, state = [], None
    for epoch in range(first, first + count):
        if hasattr(dataloader.sampler, "set_epoch"):  # as Lightning does each epoch
            dataloader.sampler.set_epoch(epoch)
        for batch in dataloader:
            batches.append(batch)
            if len(batches) == stop_after:
                state = dataloader.state_dict()
    return batches, state


def folder(num_workers: int, batch_size: int = 2, repeats: int = 1):
    return lambda: ImageFolderDataModule(
        SAMPLE_IMAGES,
        crop_size=32,
        batch_size=batch_size,
        num_workers=num_workers,
        repeats=repeats,
    )


def shards(shard_dir: Path, num_workers: int, batch_size: int = 2):
    return lambda: WebDatasetDataModule(
        str(shard_dir / "{00000..00002}.tar"),
        samples_per_epoch=4 * batch_size,
        crop_size=32,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle_buffer=4,
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("source", ["folder", "shards"])
@pytest.mark.parametrize("stop_after", [3, 4], ids=["mid-epoch", "epoch-end"])
def test_a_restored_loader_yields_what_the_original_yields_next(
    source, num_workers, stop_after, shard_dir, monkeypatch
):
    make = folder(num_workers) if source == "folder" else shards(shard_dir, num_workers)
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))  # how webdataset reads the rank
        monkeypatch.setenv("WORLD_SIZE", "2")
        reference = loader(make, rank, 2)
        per_epoch = len(reference)
        assert per_epoch == (2 if source == "folder" else 4)
        expected, state = epochs(reference, 0, 3, stop_after=stop_after)
        # Lightning's epoch after an epoch-end checkpoint is the next one
        epoch = stop_after // per_epoch
        resumed = loader(make, rank, 2)
        resumed.load_state_dict(state)
        actual, _ = epochs(resumed, epoch, 3 - epoch)
        assert len(actual) == len(expected) - stop_after
        for got, want in zip(actual, expected[stop_after:], strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_rank_using_the_first_rows_loads_those_rows_of_the_whole_batches(num_workers):
    """``use_rows(2)`` of batches of 3: each batch is the first 2 images (same crops) of the
    whole batch, as many batches per epoch, and a resumed epoch continues exactly."""
    make = folder(num_workers, batch_size=3, repeats=2)
    for rank in (0, 1):
        whole, _ = epochs(loader(make, rank, 2), 0, 2)
        reference = loader(make, rank, 2, rows=2)
        per_epoch = len(reference)
        assert per_epoch == len(whole) // 2 > 1
        used, state = epochs(reference, 0, 2, stop_after=per_epoch + 1)  # mid-epoch 1
        assert len(used) == len(whole)
        for got, want in zip(used, whole, strict=True):
            assert torch.equal(got, want[:2])
        resumed = loader(make, rank, 2, rows=2)
        resumed.load_state_dict(state)
        actual, _ = epochs(resumed, 1, 1)
        assert len(actual) == per_epoch - 1
        for got, want in zip(actual, used[per_epoch + 1 :], strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("stop_after", [3, 4], ids=["mid-epoch", "epoch-end"])
def test_shards_of_a_rank_using_the_first_rows_yield_as_many_batches_and_resume(
    stop_after, shard_dir, monkeypatch
):
    """The shards stream ``rows`` crops per batch, the whole batch's count of batches per
    epoch (ranks step alike under DDP), and resume exactly."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    make = shards(shard_dir, 0, batch_size=3)
    reference = loader(make, 1, 2, rows=1)
    assert len(reference) == len(loader(make, 1, 2)) == 4
    expected, state = epochs(reference, 0, 2, stop_after=stop_after)
    assert len(expected) == 8 and all(batch.shape[0] == 1 for batch in expected)
    resumed = loader(make, 1, 2, rows=1)
    resumed.load_state_dict(state)
    actual, _ = epochs(resumed, stop_after // 4, 2 - stop_after // 4)
    assert len(actual) == len(expected) - stop_after
    for got, want in zip(actual, expected[stop_after:], strict=True):
        assert torch.equal(got, want)


def test_a_seeded_sample_draws_from_its_seed_and_leaves_every_other_generator(monkeypatch):
    """A sample's crop draws depend on its seed only; the CPU generator is restored after,
    and no CUDA generator is reseeded (``torch.manual_seed`` would reseed them all, and set
    the training run's GPU noise back to a sample's seed)."""
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    torch.manual_seed(1)
    reseeded.clear()
    before = torch.get_rng_state()
    with seeded(sample_seed(0, 1, 2)):
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    with seeded(sample_seed(0, 1, 2)):
        assert torch.equal(torch.rand(4), first)
    with seeded(sample_seed(0, 1, 3)):
        assert not torch.equal(torch.rand(4), first)
    assert reseeded == []
