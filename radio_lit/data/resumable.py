"""Training data that continue exactly where they stopped after a resume.

A resumed run must see the same next sample with the same random crop as the uninterrupted
run, with 0 or several DataLoader workers, on one or several ranks:

* the order comes from :class:`SeededSampler`, a ``DistributedSampler`` (so Lightning keeps
  it under DDP) whose order depends only on ``(seed, epoch)`` and whose state holds both;
* each sample's crop is drawn under its own seed ``(seed, epoch, index)``
  (:func:`sample_seed`, :func:`seeded`), so it does not depend on which worker produced it
  or on what that worker drew before;
* the position in the epoch is kept by torchdata's ``StatefulDataLoader``
  (:class:`ResumableDataLoader`), whose state Lightning stores in every checkpoint and
  restores on ``--ckpt_path``; iterable datasets (webdataset shards) save their own epoch
  and position in each worker.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

# torchdata 0.11 calls a torch API that torch 2.14 deprecates, once per loader iterator.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


def sample_seed(*keys: int) -> int:
    """A 63-bit seed that depends only on the integers ``keys`` (e.g. seed, epoch, index)."""
    return hash(tuple(keys)) & (2**63 - 1)  # tuples of ints hash the same in every process


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with the CPU torch RNG seeded by ``seed``; the RNG state is restored after.

    torchvision's random transforms draw from the global torch RNG; this makes one sample's
    draws depend on its seed only. Only the CPU generator is seeded: ``torch.manual_seed``
    would also reseed every CUDA generator (left so by the restore here) and, before CUDA is
    initialized, record a stack trace per device backend (~1 ms a sample).
    """
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


class ResumableDataLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader``, resuming an epoch that had ended as the start of
    the next epoch.

    A checkpoint written after the last batch of an epoch holds a snapshot at the end of
    that epoch; ``StatefulDataLoader`` would resume it as an epoch with no batch left, one
    epoch behind Lightning's count. For a map-style dataset such a snapshot is dropped and the
    sampler moved to the next epoch (which starts from its beginning, in that epoch's order:
    Lightning creates the iterator before it calls ``set_epoch``); an iterable
    dataset keeps its state (its epoch count is in it) and its empty remainder is run
    through before the next epoch is handed out.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._finish_resumed_epoch = False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        complete = batches_yielded(state_dict) >= len(self)
        if complete and not isinstance(self.dataset, IterableDataset):
            # Lightning creates the resumed run's iterator before its set_epoch: the sampler
            # must already be at the next epoch, or that epoch would get the first one's order
            epoch = sampler_epoch(state_dict)
            if epoch is not None and hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(epoch + 1)
            return
        self._finish_resumed_epoch = complete
        super().load_state_dict(state_dict)

    def __iter__(self) -> Any:
        if self._finish_resumed_epoch:
            self._finish_resumed_epoch = False
            for _ in super().__iter__():
                raise RuntimeError("a data loader state saved at an epoch end yielded more data")
        return super().__iter__()


def sampler_epoch(state_dict: dict[str, Any]) -> int | None:
    """The epoch a ``StatefulDataLoader`` state's :class:`SeededSampler` was in, if it has one
    (0 or more workers)."""
    main = state_dict.get("_snapshot", {}).get("_main_snapshot", state_dict)
    sampler = (main.get("_sampler_iter_state") or {}).get("sampler_state") or {}
    return int(sampler["epoch"]) if "epoch" in sampler else None


def batches_yielded(state_dict: dict[str, Any]) -> int:
    """Batches a ``StatefulDataLoader`` state says its epoch had yielded (0 or more workers)."""
    if "_snapshot" in state_dict:  # worker processes
        return int(state_dict["_snapshot"]["_snapshot_step"])
    return int(state_dict.get("_num_yielded", 0))


class SeededSampler(StatefulDistributedSampler):
    """torchdata's ``StatefulDistributedSampler`` yielding ``(index, crop_seed)``, the seed
    fixed by ``(seed, epoch, index)``; its state holds the epoch as well as the position.

    Lightning creates the data iterator of a resumed run before it calls ``set_epoch``, so
    the epoch must come back with the state for a resumed epoch to keep its order.

    **Used rows** (:meth:`use_rows`): a rank whose step uses only the first ``rows`` images
    of each batch of ``batch`` (its partitions' share, radio_lit.training.partitions) is
    given, of its places ``t batch + j`` in the epoch, only those with ``j < rows`` of the
    full batches (``drop_last``): the same images in the same rows as the whole batch's
    first ``rows``, with the same crops, and the same number of batches, but the unused ones
    never decoded. The state stays the position among all the rank's places (skipped ones
    counted), so a resumed epoch continues exactly.

    Args:
        dataset: the map-style dataset (only its length is used).
        num_replicas: number of ranks.
        rank: this rank.
        seed: base seed of the shuffle and of every crop.
        shuffle: shuffle each epoch (a new order per ``set_epoch``).
    """

    def __init__(
        self, dataset: Sized, num_replicas: int, rank: int, seed: int, shuffle: bool = True
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.rows: tuple[int, int] | None = None  # (used rows, batch) when use_rows was called

    def use_rows(self, rows: int, batch: int) -> None:
        """Yield only the first ``rows`` places of each full batch of ``batch`` (see above);
        the DataLoader's batch size is then ``rows``."""
        if not 0 < rows <= batch:
            raise ValueError(f"rows={rows} must be between 1 and the batch size {batch}")
        self.rows = (rows, batch)

    def places(self) -> int:
        """This rank's places in the current epoch (subclasses may hold fewer)."""
        return self.num_samples

    def __len__(self) -> int:
        if self.rows is None:
            return self.places()
        rows, batch = self.rows
        return self.places() // batch * rows

    def indices(self) -> Iterator[int]:
        """This rank's dataset indices of the epoch: every place, or only the used rows."""
        rows, batch = self.rows or (1, 1)  # every place: one row of batches of one
        end = self.places() // batch * batch  # the full batches' places
        for index in StatefulDistributedSampler.__iter__(self):
            place = self.yielded - 1  # counts skipped places, and a resumed epoch's
            if place >= end:
                return
            if place % batch < rows:
                yield index

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        for index in self.indices():
            yield index, sample_seed(self.seed, self.epoch, index)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.set_epoch(int(state_dict["epoch"]))


class SeededItems(Dataset[Tensor]):
    """``dataset`` read with per-sample seeds: item ``(i, seed)`` is ``dataset[i]`` drawn under
    :func:`seeded` ``(seed)``; ``[3, S, S]`` uint8 for the image datasets of this package."""

    def __init__(self, dataset: Dataset[Tensor]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Tensor:
        index, seed = key
        with seeded(seed):
            return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        # num_skipped, bad_paths, ... of the wrapped dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
