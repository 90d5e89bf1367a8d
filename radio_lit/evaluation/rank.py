"""RankMe: the effective rank of the student's summaries and patch features (PHI-S A.3, table 6;
Garrido et al. 2023; Roy & Vetterli 2007).

A collapsed or low-dimensional representation has a small effective rank; PHI-S table 6 finds
teachers and RADIO students far below their channel counts (e.g. DINOv2-g 1536 channels,
RankMe 383). The covariance of each output is streamed over the images in float64 and reduced
across ranks (the normalizers' exact merge, :meth:`~radio_lit.normalizers.Normalizer.update`),
and :func:`~radio_lit.normalizers.spectral.effective_rank` turns eigenvalues into
``exp(H(p))``, ``p`` the normalized singular values of the data. RankMe is Garrido et al.'s
(and PHI-S table 6's): singular values of the uncentered features (``eval/rankme/...``); the
effective rank of the centered features is logged too, as ``eval/rankme_centered/...``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from radio_lit.data.views import as_float_images
from radio_lit.evaluation.base import Evaluation, Report, images_of
from radio_lit.evaluation.data import (
    SAMPLE_CLASSES,
    labeled_images,
    rank_batches,
    unlabeled_images,
)
from radio_lit.evaluation.view import ModelView
from radio_lit.normalizers import Normalizer
from radio_lit.normalizers.spectral import effective_rank


class CovarianceAccumulator(Normalizer):
    """The streamed float64 covariance of ``[..., dim]`` rows, reduced across ranks, and its
    effective rank (the statistics half of a :class:`~radio_lit.normalizers.Normalizer`)."""

    def rank(self, centered: bool = False) -> float:
        """Effective rank of everything accumulated (0 if under two rows).

        ``centered=False`` (RankMe, Garrido et al. eq. 1; PHI-S table 6): from the singular
        values of the rows themselves, i.e. the eigenvalues of ``Y^T Y = m2 + n mu mu^T``;
        ``centered=True``: of the rows minus their mean (the eigenvalues of ``m2``).
        """
        if self.count.item() < 2:
            return 0.0
        gram = self.m2 if centered else self.m2 + self.count * torch.outer(self.mean, self.mean)
        return float(effective_rank(torch.linalg.eigvalsh(gram)))


def rank_me(rows: Tensor, centered: bool = False) -> float:
    """Effective rank of ``rows [N, C]`` (uncentered RankMe, or ``centered``), in one process."""
    accumulator = CovarianceAccumulator(rows.shape[-1])
    accumulator.update(rows)
    return accumulator.rank(centered)


class RankMe(Evaluation):
    """Effective rank of the student's summaries and patch features, per output.

    Logs ``eval/rankme/<output>/summary`` (over images) and
    ``eval/rankme/<output>/features`` (over all patches of all images) for ``backbone`` and
    each teacher head (or the ``outputs`` given), uncentered (RankMe); the same of the centered
    features as ``eval/rankme_centered/<output>/...``.

    Cost per image: one student forward at ``resolution`` and a rank-``h*w`` update of a
    ``C x C`` float64 covariance per output; one ``C x C`` eigendecomposition per output per run.

    Args:
        images: labeled folder, plain image folder, ``"radio_lit:sample_classes"`` (the eval
            crops of the shipped photographs) or ``"radio_lit:sample_images"``.
        outputs: ``"backbone"`` and/or teacher names; default all.
        crop_size: resize (short side) and center-crop side.
        resolution: student input side; default the model's training resolution.
        per_class: crops per photograph for ``"radio_lit:sample_classes"``.
        max_images: use at most this many images of a folder (``None``: all).
        batch_size: images per forward.
        num_workers: DataLoader workers.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    def __init__(
        self,
        images: str = SAMPLE_CLASSES,
        outputs: list[str] | None = None,
        crop_size: int = 224,
        resolution: int | None = None,
        per_class: int = 8,
        max_images: int | None = None,
        batch_size: int = 32,
        num_workers: int = 0,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        self.images, self.outputs = images, outputs
        self.crop_size, self.resolution, self.per_class = crop_size, resolution, per_class
        self.max_images = max_images
        self.batch_size, self.num_workers = batch_size, num_workers

    def evaluate(self, view: ModelView) -> Report:
        dataset = _images(self.images, self.crop_size, self.per_class, self.max_images)
        device = view.device
        accumulators: dict[str, CovarianceAccumulator] = {}
        for batch, valid in rank_batches(dataset, self.batch_size, self.num_workers):
            images = as_float_images(images_of(batch).to(device))
            valid = valid.to(device)
            outputs = view(images, self.resolution)
            for name in self.outputs or list(outputs):
                out = outputs[name]
                parts = {"features": out.features}
                if out.summary is not None:
                    parts["summary"] = out.summary
                for part, values in parts.items():
                    key = f"{name}/{part}"
                    if key not in accumulators:
                        accumulators[key] = CovarianceAccumulator(values.shape[-1]).to(device)
                    accumulators[key].update(values.float()[valid])
        scalars = {f"eval/rankme/{k}": a.rank() for k, a in accumulators.items()}
        scalars.update({f"eval/rankme_centered/{k}": a.rank(True) for k, a in accumulators.items()})
        return Report(scalars=scalars)


def _images(root: str, crop_size: int, per_class: int, limit: int | None) -> Dataset:
    """The eval crops of the shipped photographs, or the images of a folder (labels unused)."""
    if root == SAMPLE_CLASSES:
        dataset = labeled_images(root, "eval", crop_size, per_class)
        return dataset if limit is None else Subset(dataset, range(min(limit, len(dataset))))
    return unlabeled_images(root, crop_size, limit)
