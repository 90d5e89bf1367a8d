"""Linear-probe semantic segmentation on frozen features: the dense benchmark of the RADIO
papers (ADE20k mIoU; AM-RADIO table 1, RADIOv2.5, C-RADIOv4 table 2 at 512/1024/1536 px).

Protocol, after NVlabs/RADIO's mmseg config ``radio_linear_8xb2-80k_ade20k-512x512.py``:

- head: BatchNorm + 1x1 convolution on the frozen student's patch features (``BNHead``,
  no dropout), logits bilinearly upsampled to the labels, cross-entropy, label 0 ignored
  (``reduce_zero_label``);
- training: AdamW, lr 1e-3, betas (0.9, 0.999), no weight decay; linear warm-up from
  ``1e-6 x`` over 1500 iterations then linear ("poly", power 1) decay to 0 at 80k
  iterations; 16 crops per iteration (8 GPUs x 2); crops: short side rescaled to
  ``resolution x [0.5, 2]``, random ``resolution x resolution`` crop, horizontal flip;
- evaluation: short side resized to ``resolution`` (long side at most 4x), per-class IoU over
  the whole validation split (torchmetrics' ``MulticlassJaccardIndex``, classes absent from
  both prediction and labels left out), the mean in percent.

Departures (``[choice]``): the crop is ``resolution`` (NVlabs: 518 for patch 14, i.e. 512
rounded to the patch), mmseg's photometric distortion and ``cat_max_ratio`` crop rule are left
out, and evaluation slides ``resolution x resolution`` windows (stride 2/3 of the window,
logits averaged) over the resized image where NVlabs' config feeds the whole padded image:
the student then always sees the resolution it is probed at, as the issue's 512/1024/1536
protocol asks. The defaults are that protocol; the quickstart runs a few hundred steps on
the synthetic set (:data:`~radio_lit.evaluation.segmentation_data.SAMPLE_SEGMENTATION`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset
from torchmetrics.classification import MulticlassJaccardIndex

from radio_lit.evaluation.base import Evaluation, Report
from radio_lit.evaluation.data import rank_batches, world
from radio_lit.evaluation.segmentation_data import (
    IGNORE,
    SAMPLE_SEGMENTATION,
    SPLITS,
    image_sizes,
    random_scale_crop,
    resize_short_side,
    segmentation_set,
    shift_labels,
    window_starts,
)
from radio_lit.evaluation.view import BACKBONE, ModelView


class LinearSegmentationHead(nn.Module):
    """``[B, C, h, w]`` features -> ``[B, K, h, w]`` logits: BatchNorm, then a 1x1 convolution."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.classifier = nn.Conv2d(channels, num_classes, kernel_size=1)

    def forward(self, features: Tensor) -> Tensor:
        return self.classifier(self.bn(features))


def miou_metric(num_classes: int) -> MulticlassJaccardIndex:
    """mmseg's mIoU as a torchmetrics metric: fed ``(predictions [B, H, W], labels [B, H, W])``
    in class indices (labels :data:`IGNORE` skipped), it sums each class's intersection and
    union over every update (and rank), and ``compute()`` averages the per-class IoUs over
    the classes present in the predictions or the labels."""
    return MulticlassJaccardIndex(num_classes, average="macro", ignore_index=IGNORE)


class SegmentationProbe(Evaluation):
    """Linear-probe segmentation mIoU of the frozen student (see the module docstring).

    Logs ``eval/segmentation/<output>/miou_<resolution>`` (percent) for each resolution: a
    head is trained and evaluated at each.

    Cost per resolution: ``steps x batch_size`` student forwards of ``resolution``-sided crops
    and a head update each; one forward per sliding window of each validation image.

    Distributed: each rank draws its own crops (its seed offset by its rank), the head's
    gradients and at the end its BatchNorm statistics are averaged over the ranks (NVlabs
    uses SyncBN), every rank runs the same number of student forwards; the validation split
    is shared out and the IoU counts reduced by torchmetrics.

    Args:
        root: ADE20k-layout folder (``images/{training,validation}``,
            ``annotations/{training,validation}``), or ``"radio_lit:sample_segmentation"``.
        num_classes: classes ``K`` (label values ``1..K``; 150 for ADE20k).
        output: whose features are probed: ``"backbone"`` (the student's) or a teacher's name
            (the student's features through that teacher's adaptor head).
        resolutions: probe resolutions (crop and window sides; multiples of the patch size):
            512 as in AM-RADIO / RADIOv2.5, ``[512, 1024, 1536]`` as in C-RADIOv4.
        steps: head training iterations (80k in NVlabs' config).
        warmup_steps: linear warm-up iterations (1500).
        batch_size: crops per iteration (16).
        lr: AdamW learning rate (1e-3).
        stride: sliding-window stride as a fraction of the window ([choice] 2/3).
        max_train_images: use at most this many training images (all: ``None``).
        max_val_images: evaluate at most this many validation images (all: ``None``).
        sample_count: images per split of ``"radio_lit:sample_segmentation"``.
        seed: seed of the crops and the head's initialization.
        num_workers: DataLoader workers decoding the folder.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    def __init__(
        self,
        root: str = SAMPLE_SEGMENTATION,
        num_classes: int = 150,
        output: str = BACKBONE,
        resolutions: Sequence[int] = (512,),
        steps: int = 80_000,
        warmup_steps: int = 1500,
        batch_size: int = 16,
        lr: float = 1e-3,
        stride: float = 2 / 3,
        max_train_images: int | None = None,
        max_val_images: int | None = None,
        sample_count: int = 32,
        seed: int = 0,
        num_workers: int = 0,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        if steps < 1 or not 0 <= warmup_steps < steps or batch_size < 1 or lr <= 0:
            raise ValueError(
                "SegmentationProbe: need steps >= 1, 0 <= warmup_steps < steps, batch_size >= 1 "
                f"and lr > 0, got steps={steps}, warmup_steps={warmup_steps}, "
                f"batch_size={batch_size}, lr={lr}"
            )
        if not 0 < stride <= 1 or num_classes < 1 or not resolutions:
            raise ValueError(
                "SegmentationProbe: need 0 < stride <= 1, num_classes >= 1 and at least one "
                f"resolution, got stride={stride}, num_classes={num_classes}, "
                f"resolutions={list(resolutions)}"
            )
        if root != SAMPLE_SEGMENTATION:
            missing = [s for s in SPLITS if not (Path(root).expanduser() / "images" / s).is_dir()]
            if missing:
                raise FileNotFoundError(
                    f"SegmentationProbe root: {root} has no images/{missing[0]}/ folder; point "
                    "root at a folder in ADE20k's layout (images/{training,validation}/*.jpg, "
                    "annotations/{training,validation}/*.png), e.g. ADEChallengeData2016, or "
                    f"use {SAMPLE_SEGMENTATION!r}"
                )
        self.root, self.num_classes, self.output = root, num_classes, output
        self.resolutions = [int(r) for r in resolutions]
        self.steps, self.warmup_steps = steps, warmup_steps
        self.batch_size, self.lr, self.stride = batch_size, lr, stride
        self.max_train_images, self.max_val_images = max_train_images, max_val_images
        self.sample_count, self.seed, self.num_workers = sample_count, seed, num_workers

    def outputs_read(self) -> list[str]:
        return [self.output]

    def evaluate(self, view: ModelView) -> Report:
        train = _limit(
            segmentation_set(self.root, "training", self.sample_count), self.max_train_images
        )
        validation = _limit(
            segmentation_set(self.root, "validation", self.sample_count), self.max_val_images
        )
        report = Report()
        for resolution in self.resolutions:
            if resolution % view.patch_size:
                raise ValueError(
                    f"SegmentationProbe: resolution {resolution} is not a multiple of the "
                    f"student's patch size {view.patch_size}; set resolutions to multiples of it"
                )
            head = self.train_head(view, train, resolution)
            score = self.score(view, head, validation, resolution)
            report.scalars[f"eval/segmentation/{self.output}/miou_{resolution}"] = score
        return report

    def features(self, view: ModelView, images: Tensor, resolution: int) -> Tensor:
        """``[B, C, h, w]`` frozen features of ``images [B, 3, r, r]`` in ``[0, 1]``."""
        outputs = view(images, resolution)
        if self.output not in outputs:
            raise ValueError(
                f"SegmentationProbe: output {self.output!r} does not exist; the model returns "
                f"{sorted(outputs)}"
            )
        return outputs[self.output].features.permute(0, 3, 1, 2).float()

    def train_head(
        self, view: ModelView, train: Dataset, resolution: int
    ) -> LinearSegmentationHead:
        """A head trained on ``train``'s crops at ``resolution`` (BatchNorm in eval mode after)."""
        device = view.device
        rank, size = world()
        generator = torch.Generator().manual_seed(self.seed * 7919 + rank)
        crops = _crops(train, resolution, generator, self.num_workers)
        head: LinearSegmentationHead | None = None
        optimizer = schedule = None
        for _ in range(self.steps):
            images, labels = (t.to(device) for t in _batch(crops, self.batch_size))
            self._check_labels(labels)
            frozen = self.features(view, images, resolution)
            # radio-lit validate / test run the measures under inference mode: the head trains
            # outside it, on copies of the (inference) features and labels.
            with torch.inference_mode(False), torch.enable_grad():
                features, labels = frozen.clone(), labels.clone()
                if head is None:
                    torch.manual_seed(self.seed)
                    head = LinearSegmentationHead(features.shape[1], self.num_classes).to(device)
                    optimizer = torch.optim.AdamW(
                        head.parameters(), lr=self.lr, betas=(0.9, 0.999), weight_decay=0.0
                    )
                    schedule = _warmup_poly(optimizer, self.warmup_steps, self.steps)
                logits = F.interpolate(
                    head(features), size=labels.shape[-2:], mode="bilinear", align_corners=False
                )
                loss = F.cross_entropy(logits, labels, ignore_index=IGNORE)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if size > 1:
                    for param in head.parameters():
                        dist.all_reduce(param.grad)
                        param.grad.div_(size)
                optimizer.step()
                schedule.step()
        if size > 1:
            with torch.inference_mode(False):
                for buffer in (head.bn.running_mean, head.bn.running_var):
                    dist.all_reduce(buffer)
                    buffer.div_(size)
        return head.eval()

    @torch.no_grad()
    def score(
        self,
        view: ModelView,
        head: LinearSegmentationHead,
        validation: Dataset,
        resolution: int,
    ) -> float:
        """mIoU (percent) of ``head`` on ``validation``, sliding windows at ``resolution``."""
        device = view.device
        metric = miou_metric(self.num_classes).to(device)
        _, size = world()
        windows = 0
        for (image, labels), valid in rank_batches(validation, 1, self.num_workers):
            logits, count = self.sliding_logits(view, head, image.to(device), resolution)
            windows += count
            if bool(valid[0]):
                labels = self._check_labels(shift_labels(labels.to(device)))
                metric.update(logits.argmax(1), labels)
        if size > 1:  # every rank runs as many (collective, under FSDP) forwards
            most = _most_windows(validation, resolution, self.stride, size)
            for _ in range(most - windows):
                self.features(
                    view, torch.zeros(1, 3, resolution, resolution, device=device), resolution
                )
        return 100.0 * float(metric.compute())

    def _check_labels(self, labels: Tensor) -> Tensor:
        """``labels`` (class indices), refused with one line if one is not below ``K``."""
        top = int(labels.max()) if labels.numel() else -1
        if top >= self.num_classes:
            raise ValueError(
                f"SegmentationProbe num_classes: the annotations hold label {top + 1}, above "
                f"num_classes={self.num_classes}; set num_classes to the dataset's class count "
                "(150 for ADE20k)"
            )
        return labels

    def sliding_logits(
        self, view: ModelView, head: LinearSegmentationHead, image: Tensor, resolution: int
    ) -> tuple[Tensor, int]:
        """``[1, K, H, W]`` logits of ``image [1, 3, H, W]`` uint8 (resized to short side
        ``resolution``, windows of ``resolution`` averaged, upsampled back to ``H x W``), and
        the number of windows (student forwards)."""
        scaled = resize_short_side(image.float() / 255.0, resolution, 4 * resolution)
        height, width = scaled.shape[-2:]
        stride = max(1, round(self.stride * resolution))
        total = scaled.new_zeros(1, self.num_classes, height, width)
        count = scaled.new_zeros(1, 1, height, width)
        starts = list(
            itertools.product(
                window_starts(height, resolution, stride), window_starts(width, resolution, stride)
            )
        )
        for top, left in starts:
            window = scaled[..., top : top + resolution, left : left + resolution]
            h, w = window.shape[-2:]
            if (h, w) != (resolution, resolution):  # smaller than a window: pad, then cut
                window = F.pad(window, (0, resolution - w, 0, resolution - h))
            logits = F.interpolate(
                head(self.features(view, window, resolution)),
                size=(resolution, resolution),
                mode="bilinear",
                align_corners=False,
            )
            total[..., top : top + h, left : left + w] += logits[..., :h, :w]
            count[..., top : top + h, left : left + w] += 1
        logits = F.interpolate(
            total / count, size=image.shape[-2:], mode="bilinear", align_corners=False
        )
        return logits, len(starts)


def _most_windows(dataset: Dataset, resolution: int, stride: float, ranks: int) -> int:
    """The most sliding windows a rank runs over its share of ``dataset`` as
    :func:`~radio_lit.evaluation.data.rank_batches` deals it out (image sizes read from the
    files' headers, nothing decoded)."""
    step = max(1, round(stride * resolution))
    windows = []
    for height, width in image_sizes(dataset):
        scale = min(resolution / min(height, width), 4 * resolution / max(height, width))
        h, w = max(1, round(height * scale)), max(1, round(width * scale))
        windows.append(
            len(window_starts(h, resolution, step)) * len(window_starts(w, resolution, step))
        )
    per_rank = math.ceil(len(windows) / ranks)
    most = 0
    for rank in range(ranks):
        mine = list(range(rank, len(windows), ranks))
        mine += [mine[-1] if mine else 0] * (per_rank - len(mine))
        most = max(most, sum(windows[i] for i in mine))
    return most


def _limit(dataset: Dataset, limit: int | None) -> Dataset:
    if limit is not None and limit < len(dataset):  # type: ignore[arg-type]
        return Subset(dataset, range(limit))
    return dataset


def _crops(
    dataset: Dataset, crop: int, generator: torch.Generator, num_workers: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless training crops: epochs over this rank's share of ``dataset`` in a random order."""
    rank, size = world()
    mine = list(range(rank, len(dataset), size)) or [0]  # type: ignore[arg-type]
    while True:
        order = [mine[i] for i in torch.randperm(len(mine), generator=generator).tolist()]
        loader = DataLoader(Subset(dataset, order), batch_size=None, num_workers=num_workers)
        for image, labels in loader:
            yield random_scale_crop(image, shift_labels(labels), crop, generator)


def _batch(crops: Iterator[tuple[Tensor, Tensor]], size: int) -> tuple[Tensor, Tensor]:
    images, labels = zip(*itertools.islice(crops, size), strict=True)
    return torch.stack(images), torch.stack(labels)


def _warmup_poly(
    optimizer: torch.optim.Optimizer, warmup: int, steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """mmseg's ``LinearLR(start_factor=1e-6)`` for ``warmup`` iterations, then
    ``PolyLR(power=1, eta_min=0)`` until ``steps``."""
    decay = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=steps - warmup, power=1.0)
    if warmup == 0:
        return decay
    ramp = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1e-6, end_factor=1.0, total_iters=warmup
    )
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [ramp, decay], milestones=[warmup])
