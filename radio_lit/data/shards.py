"""Web-scale training images from webdataset tar shards (DataComp / img2dataset layout).

A shard holds samples as files sharing a key, e.g. ``000000042.jpg`` with ``000000042.txt``
and ``000000042.json``; the image (``jpg``, ``jpeg``, ``png`` or ``webp``) is used, the rest
ignored. Shards are resampled with replacement, so an epoch is a fixed number of samples
rather than a pass over the shards:

* every (rank, DataLoader worker) draws its own shard sequence and shuffles its own samples,
  seeded by ``seed``, its rank, its worker id and its epoch count, so ranks and workers read
  different data and a run is reproducible (the rank is read as webdataset does: ``RANK`` /
  ``WORLD_SIZE`` in the environment, else ``torch.distributed``);
* samples are shuffled in a buffer of raw (still encoded) samples, then decoded and cropped,
  each crop under its own seed; each worker's epoch and position are saved in checkpoints
  (``state_dict``), so a resumed run continues with the same samples and crops;
* an epoch yields ``samples_per_epoch // batch_size`` whole batches per rank, dealt to the
  workers so that their counts add up exactly (no partial batch is ever dropped).

Unreadable samples (corrupt image, sample without image, broken tar) are skipped with a
logged warning and counted in :attr:`ImageShards.num_skipped`, across workers.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import torch
import webdataset as wds
from PIL import Image
from torch import Tensor
from torch.utils.data import IterableDataset
from webdataset.shardlists import expand_urls
from webdataset.utils import pytorch_worker_info

from radio_lit.data.resumable import sample_seed, seeded
from radio_lit.data.transforms import IMAGE_EXTENSIONS, ImageTransform, load_rgb, read_crop

logger = logging.getLogger(__name__)

#: Sample keys looked up, in this order, for the encoded image of a sample.
IMAGE_KEYS: tuple[str, ...] = tuple(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)


def expand_shard_urls(urls: str | Sequence[str]) -> list[str]:
    """Shard urls from one pattern or a list of patterns, brace-expanded in order.

    ``"/data/{00000..00002}.tar"`` -> ``["/data/00000.tar", "/data/00001.tar",
    "/data/00002.tar"]``; a pattern may also join several patterns with ``::``.
    """
    patterns = [urls] if isinstance(urls, str) else list(urls)
    expanded = [url for pattern in patterns for url in expand_urls(pattern)]
    if not expanded:
        raise ValueError(f"no shard urls given: {urls!r}")
    return expanded


def existing_shard_urls(urls: str | Sequence[str]) -> list[str]:
    """:func:`expand_shard_urls`, checked: ``FileNotFoundError`` if a local shard is missing.

    Remote urls and pipes cannot be checked before they are read and are taken as given.
    """
    expanded = expand_shard_urls(urls)
    missing = [
        url
        for url in expanded
        if (path := local_shard_path(url)) is not None and not path.is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of {len(expanded)} shards do not exist, e.g. {missing[0]} "
            f"(from {urls!r}); give a brace pattern of existing .tar files such as "
            "/data/shards/{00000..00099}.tar"
        )
    return expanded


def local_shard_path(url: str) -> Path | None:
    """The file a plain path or ``file:`` url names; ``None`` for remote urls and pipes."""
    parsed = urlparse(url)
    if parsed.scheme == "":
        return Path(url)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    return None


def worker_share(num_batches: int, worker: int, num_workers: int) -> int:
    """Batches for ``worker`` of ``num_workers``: the shares add up to ``num_batches``."""
    return num_batches // num_workers + int(worker < num_batches % num_workers)


class ImageShards(IterableDataset[Tensor]):
    """Resampled webdataset shards -> ``[3, S, S]`` uint8 crops, a fixed number per epoch.

    Args:
        urls: shard url pattern(s), see :func:`expand_shard_urls`; local paths or any url
            webdataset opens (``pipe:``, ``http(s)://``, ...).
        transform: decoded RGB PIL image -> ``[3, S, S]`` uint8 tensor (``transforms.py``).
        samples_per_epoch: samples per epoch on this rank, rounded down to whole batches.
        batch_size: the DataLoader's batch size; each worker yields whole batches.
        shuffle_buffer: number of encoded samples in the shuffle buffer.
        seed: base seed of shard resampling and sample shuffling.

    ``len(dataset)`` is the number of samples one rank yields per epoch (all its workers
    together), a multiple of ``batch_size``. Each copy of the dataset counts its own epochs,
    so with DataLoader workers use ``persistent_workers=True`` (as the datamodules do):
    otherwise every epoch starts afresh from epoch 0 and repeats the same stream.
    """

    #: Failures without a sample in between after which a worker stops with an error.
    max_failures_in_a_row = 1000

    def __init__(
        self,
        urls: str | Sequence[str],
        transform: ImageTransform,
        samples_per_epoch: int,
        batch_size: int,
        shuffle_buffer: int = 1000,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size <= 0 or samples_per_epoch < batch_size:
            raise ValueError(
                f"samples_per_epoch ({samples_per_epoch}) must be at least one batch "
                f"(batch_size={batch_size})"
            )
        if shuffle_buffer <= 0:
            raise ValueError(f"shuffle_buffer must be positive, got {shuffle_buffer}")
        self.urls = existing_shard_urls(urls)
        self.transform = transform
        self.batch_size = batch_size
        self.num_batches = samples_per_epoch // batch_size
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self._epoch = -1  # per process: advances each time this copy starts an epoch
        self._position = 0  # raw samples read in this epoch (including unreadable ones)
        self._yielded = 0  # crops yielded in this epoch
        self._resume: tuple[int, int] | None = None  # set by load_state_dict
        self._failures_in_a_row = 0
        self._skipped = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    def __iter__(self) -> Iterator[Tensor]:
        """One epoch of this worker's share: whole batches' worth of ``[3, S, S]`` crops.

        Each crop is drawn under its own seed ``(seed, rank, worker, epoch, position)``
        (``resumable.py``), so a resumed worker draws the crops the interrupted one would have.
        """
        rank, _, worker, num_workers = pytorch_worker_info()
        resume, self._resume = self._resume, None
        if resume is None:
            self._epoch += 1
            self._position = self._yielded = 0
        rng = random.Random(f"{self.seed}/{rank}/{worker}/{self._epoch}")
        raw = iter(
            wds.DataPipeline(
                wds.ResampledShards(self.urls, seed=rng.getrandbits(31), deterministic=True),
                wds.tarfile_to_samples(handler=self._skip),
                wds.shuffle(self.shuffle_buffer, rng=rng),
            )
        )
        for _ in range(self._position):  # a resumed epoch: skip what was read, undecoded
            next(raw)
        count = worker_share(self.num_batches, worker, num_workers) * self.batch_size
        while self._yielded < count:
            sample = next(raw)
            self._position += 1
            seed = sample_seed(self.seed, rank, worker, self._epoch, self._position)
            try:
                with seeded(seed):  # the crop box is drawn before decoding (read_crop)
                    crop = read_crop(self.transform, *encoded_image(sample))
            except Exception as error:  # corrupt or missing image: counted and skipped
                self._skip(error)
                continue
            self._failures_in_a_row = 0
            self._yielded += 1
            yield crop

    def state_dict(self) -> dict[str, int]:
        """This worker's epoch and position in it (saved by torchdata's StatefulDataLoader)."""
        return {"epoch": self._epoch, "position": self._position, "yielded": self._yielded}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continue the saved epoch after the saved position (a finished share yields nothing
        more this epoch); the next ``__iter__`` after that starts the next epoch."""
        self._epoch = int(state_dict["epoch"])
        self._position = int(state_dict["position"])
        self._yielded = int(state_dict["yielded"])
        self._resume = (self._epoch, self._position)

    @property
    def num_skipped(self) -> int:
        """Unreadable samples and shard read errors skipped so far, by all workers.

        Workers share one counter without a lock, so failures in two workers at the same
        instant may be counted once.
        """
        return int(self._skipped.item())

    def _skip(self, exn: Exception) -> bool:
        """webdataset error handler: count, warn, and continue with the next sample.

        Gives up with ``RuntimeError`` after :attr:`max_failures_in_a_row` failures without a
        sample in between: then the urls or the data are wrong, and resampling would retry
        forever.
        """
        self._skipped += 1
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= self.max_failures_in_a_row:
            raise RuntimeError(
                f"{self._failures_in_a_row} unreadable samples or shards in a row from "
                f"{len(self.urls)} shard(s) such as {self.urls[0]}; last error: {exn}"
            ) from exn
        logger.warning("skipping unreadable shard sample: %s", exn)
        return True


def decode_image(sample: dict[str, Any]) -> Image.Image:
    """The sample's first image entry (see :data:`IMAGE_KEYS`) decoded as an RGB PIL image."""
    return load_rgb(*encoded_image(sample))


def encoded_image(sample: dict[str, Any]) -> tuple[bytes, str]:
    """The sample's first image entry (see :data:`IMAGE_KEYS`), encoded, and its name."""
    name = f"{sample.get('__url__')}:{sample.get('__key__')}"
    for key in IMAGE_KEYS:
        if key in sample:
            return sample[key], f"{name}.{key}"
    raise ValueError(f"sample {name} has no image entry {IMAGE_KEYS}: keys {sorted(sample)}")
