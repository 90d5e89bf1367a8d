"""Robustness across student resolutions: mode switching (AM-RADIO section 6, figure 4) and
scale equivariance (RADIOv2.5 section 4.1, supplement F).

Mode switching: the student's estimate of a teacher at student resolution ``r``, bilinearly
resized to the teacher's grid, against the teacher's own features at its native resolution
(NVlabs/RADIO ``examples/mode_switching.py``). AM-RADIO's student showed a sudden jump of this
error above 720 px, where it switched from DINOv2-like to SAM-like features; RADIOv2.5's
multi-resolution training removes it.

Scale equivariance ``σ²_scale``: the student's features at several resolutions, standardized
per channel with the statistics of the smallest map, bilinearly resized to the smallest grid,
and the variance across resolutions averaged over positions and channels (RADIOv2.5
supplement F, eqs. 7-11, and its implementation F.1). 0 means the features at every
resolution agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from radio_lit.data.image_folder import SAMPLE_IMAGES
from radio_lit.data.views import as_float_images
from radio_lit.evaluation.base import Evaluation, Report, images_of
from radio_lit.evaluation.data import rank_batches, unlabeled_images
from radio_lit.evaluation.view import BACKBONE, ModelView


def _nchw_resize(features: Tensor, size: tuple[int, int], align_corners: bool) -> Tensor:
    """Bilinear resize of ``[B, h, w, C]`` to ``[B, H, W, C]``."""
    if tuple(features.shape[1:3]) == tuple(size):
        return features
    nchw = features.permute(0, 3, 1, 2)
    resized = F.interpolate(nchw, size=size, mode="bilinear", align_corners=align_corners)
    return resized.permute(0, 2, 3, 1)


def scale_variance(features: Sequence[Tensor], scale_up: bool = False) -> Tensor:
    """RADIOv2.5 ``σ²_scale`` per image (supplement F, eqs. 7-11; implementation F.1).

    Args:
        features: one ``[B, H_i, W_i, C]`` map per scale, the same images in the same order.
        scale_up: standardize by and resize to the largest map instead of the smallest (F.1's
            ``scale_up=True``); the paper's measure uses the smallest.

    Returns:
        ``[B]``: each image's variance across scales (unbiased, as ``torch.var`` in F.1),
        averaged over positions and channels; the mean over ``B`` is F.1's value.
    """
    if len(features) < 2:
        raise ValueError("scale_variance needs features at two or more scales")
    pick = max if scale_up else min
    target = pick(features, key=lambda f: f.shape[1] * f.shape[2]).double()
    size = (target.shape[1], target.shape[2])
    mean = target.mean(dim=(1, 2), keepdim=True)
    std = target.std(dim=(1, 2), keepdim=True)  # unbiased, as in F.1
    normalized = [
        _nchw_resize((f.double() - mean) / (std + 1e-8), size, align_corners=False)
        for f in features
    ]
    return torch.stack(normalized).var(dim=0).mean(dim=(1, 2, 3))


def patch_multiples(base: int, factors: Sequence[float], patch: int) -> list[int]:
    """Sorted distinct multiples of ``patch`` nearest to ``base * f`` (at least one patch)."""
    return sorted({max(patch, round(base * f / patch) * patch) for f in factors})


class ModeSwitching(Evaluation):
    """Per teacher: the error of the student's head against the teacher, per student resolution.

    Logs the curve ``eval/mode_switching/<teacher>/mse`` (and ``cosine_error``) against the
    student resolution: as scalars ``.../step_<training step>`` whose step axis is the
    resolution, and a figure if matplotlib is installed; a markdown table; and, at the
    training step, ``.../jump_resolution`` (the resolution where the error grows most
    relative to the previous one) and ``.../jump_ratio`` (that growth, ``err(r_i) /
    err(r_{i-1})``; near or below 1 means no mode switch).

    Cost per image: one student forward per resolution (the largest dominates) and one forward
    per teacher on the first run only (teacher features are cached).

    Args:
        resolutions: student input sides; default patch multiples of 0.5, 0.75, 1, 1.5, 2, 3
            and 4 times the training resolution (AM-RADIO figure 4 sweeps 224-1024 px).
        teachers: teachers to compare; default every teacher the model has an estimate of.
        images: folder of images, or ``"radio_lit:sample_images"``.
        max_images: how many images (the first in sorted order).
        crop_size: images are resized (short side) and center-cropped to this side before
            the per-resolution resize; default the largest resolution.
        batch_size: images per forward.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    def __init__(
        self,
        resolutions: list[int] | None = None,
        teachers: list[str] | None = None,
        images: str = SAMPLE_IMAGES,
        max_images: int = 16,
        crop_size: int | None = None,
        batch_size: int = 8,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        if resolutions is not None and len(resolutions) < 2:
            raise ValueError("ModeSwitching.resolutions needs at least two resolutions")
        self.resolutions = sorted(resolutions) if resolutions is not None else None
        self.teachers = teachers
        self.images, self.max_images, self.crop_size = images, max_images, crop_size
        self.batch_size = batch_size
        self._reference: dict[int, dict[str, Tensor]] = {}

    def evaluate(self, view: ModelView) -> Report:
        resolutions = self.resolutions or patch_multiples(
            view.resolution[0], (0.5, 0.75, 1, 1.5, 2, 3, 4), view.patch_size
        )
        names = self.teachers if self.teachers is not None else list(view.teachers)
        missing = sorted(set(names) - set(view.teachers))
        if missing:
            raise ValueError(
                f"ModeSwitching.teachers names {missing}, which the model does not have; its "
                f"teachers are {sorted(view.teachers)}"
            )
        dataset = unlabeled_images(self.images, self.crop_size or resolutions[-1], self.max_images)
        device = view.device
        mse = {(n, r): MeanMetric().to(device) for n in names for r in resolutions}
        cosine = {(n, r): MeanMetric().to(device) for n in names for r in resolutions}
        for i, (batch, valid) in enumerate(rank_batches(dataset, self.batch_size)):
            images = as_float_images(images_of(batch).to(device))
            valid = valid.to(device)
            if i not in self._reference:
                outs = view.teacher_outputs(images, names)
                self._reference[i] = {n: outs[n].features.float() for n in names}
            reference = self._reference[i]
            for r in resolutions:
                outputs = view(images, r)
                for n in names:
                    target = reference[n]
                    estimate = _nchw_resize(outputs[n].features.float(), target.shape[1:3], True)
                    per_image_mse = (estimate - target).pow(2).mean(dim=(1, 2, 3))
                    per_image_cos = 1 - F.cosine_similarity(estimate, target, dim=-1).mean(
                        dim=(1, 2)
                    )
                    mse[n, r].update(per_image_mse[valid])
                    cosine[n, r].update(per_image_cos[valid])
        report = Report()
        for n in names:
            for kind, metrics in (("mse", mse), ("cosine_error", cosine)):
                curve = {r: float(metrics[n, r].compute()) for r in resolutions}
                report.curves[f"eval/mode_switching/{n}/{kind}"] = curve
            curve = report.curves[f"eval/mode_switching/{n}/mse"]
            jump_at, ratio = largest_jump(curve)
            report.scalars[f"eval/mode_switching/{n}/jump_resolution"] = float(jump_at)
            report.scalars[f"eval/mode_switching/{n}/jump_ratio"] = ratio
            rows = "\n".join(f"| {r} | {curve[r]:.4g} |" for r in resolutions)
            report.text[f"eval/mode_switching/{n}"] = (
                f"| student resolution | MSE vs {n} |\n| --- | --- |\n{rows}\n\n"
                f"largest jump: x{ratio:.3g} at {jump_at} px"
            )
        return report


def largest_jump(curve: dict[int, float]) -> tuple[int, float]:
    """``(resolution, ratio)`` where ``err(r_i) / err(r_{i-1})`` is largest along the curve."""
    xs = sorted(curve)
    ratios = [(curve[b] / max(curve[a], 1e-12), b) for a, b in zip(xs[:-1], xs[1:], strict=True)]
    ratio, at = max(ratios)
    return at, ratio


class ScaleEquivariance(Evaluation):
    """RADIOv2.5's scale equivariance ``σ²_scale`` of the student's features, fine and coarse.

    Logs ``eval/scale_equivariance/<output>/fine`` and ``.../coarse`` (lower is better;
    RADIOv2.5 table 2: DINOv2-g 0.126 / 0.178, AM-RADIO-L 0.357 / 0.476, RADIOv2.5-L
    0.102 / 0.165). The paper does not list its resolutions; this project's choice is
    *fine*: five resolutions one patch apart from the training resolution, *coarse*: 1, 2 and 3
    times it (the steps that tiling would allow).

    Cost per image: one student forward per resolution of both lists.

    Args:
        fine_resolutions: student sides for the fine measure (default above).
        coarse_resolutions: student sides for the coarse measure (default above).
        outputs: feature maps to measure: ``"backbone"`` and/or teacher names.
        images: folder of images, or ``"radio_lit:sample_images"``.
        max_images: how many images.
        crop_size: resize and center-crop side before the per-resolution resize; default the
            largest resolution.
        batch_size: images per forward.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    def __init__(
        self,
        fine_resolutions: list[int] | None = None,
        coarse_resolutions: list[int] | None = None,
        outputs: list[str] | None = None,
        images: str = SAMPLE_IMAGES,
        max_images: int = 16,
        crop_size: int | None = None,
        batch_size: int = 8,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        for name, given in (("fine", fine_resolutions), ("coarse", coarse_resolutions)):
            if given is not None and len(given) < 2:
                raise ValueError(
                    f"ScaleEquivariance.{name}_resolutions needs at least two resolutions"
                )
        self.fine, self.coarse = fine_resolutions, coarse_resolutions
        self.outputs = list(outputs) if outputs is not None else [BACKBONE]
        self.images, self.max_images, self.crop_size = images, max_images, crop_size
        self.batch_size = batch_size

    def evaluate(self, view: ModelView) -> Report:
        base, patch = view.resolution[0], view.patch_size
        scales = {
            "fine": self.fine or [base + i * patch for i in range(5)],
            "coarse": self.coarse or [base, 2 * base, 3 * base],
        }
        largest = max(max(r) for r in scales.values())
        dataset = unlabeled_images(self.images, self.crop_size or largest, self.max_images)
        device = view.device
        metrics = {(o, s): MeanMetric().to(device) for o in self.outputs for s in scales}
        for batch, valid in rank_batches(dataset, self.batch_size):
            images = as_float_images(images_of(batch).to(device))
            valid = valid.to(device)
            features = {r: view(images, r) for r in sorted(set().union(*scales.values()))}
            for output in self.outputs:
                for scale, resolutions in scales.items():
                    maps = [features[r][output].features.float() for r in resolutions]
                    metrics[output, scale].update(scale_variance(maps)[valid])
        return Report(
            scalars={
                f"eval/scale_equivariance/{o}/{s}": float(m.compute())
                for (o, s), m in metrics.items()
            }
        )
