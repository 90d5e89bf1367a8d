"""PCA images of patch features (AM-RADIO figure 1; RADIOv2.5 figures 3 and 9; NVlabs/RADIO
``examples/visualize_features.py``).

The first three principal components of an image's patch features become its red, green and
blue channels, each scaled to ``[0, 1]`` over a robust range: ``median ± 2 MAD`` of the
component (outliers clamp), as in RADIO's ``get_robust_pca``. A teacher head's features are
shown next to the teacher's own features projected with the *teacher's* components and ranges,
so equal colours mean equal features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from radio_lit.data.image_folder import SAMPLE_IMAGES
from radio_lit.data.views import as_float_images, resize_view
from radio_lit.evaluation.base import Evaluation, Report
from radio_lit.evaluation.data import unlabeled_images
from radio_lit.evaluation.view import BACKBONE, ModelView
from radio_lit.normalizers.spectral import canonical_signs


@dataclass
class PCAColors:
    """A fitted feature-to-RGB map: ``rgb = clamp((x - mean) @ axes - low) / (high - low)``.

    Attributes:
        mean: ``[C]`` feature mean.
        axes: ``[C, 3]`` first three principal axes (zero columns if fewer exist).
        low: ``[3]`` lower end of each component's robust range.
        high: ``[3]`` upper end.
    """

    mean: Tensor
    axes: Tensor
    low: Tensor
    high: Tensor

    @classmethod
    def fit(cls, features: Tensor, spread: float = 2.0) -> PCAColors:
        """Fit on ``features [..., C]`` (every leading position is a sample)."""
        x = features.reshape(-1, features.shape[-1]).double()
        mean = x.mean(0)
        centered = x - mean
        _, _, vh = torch.linalg.svd(centered, full_matrices=False)
        axes = torch.zeros(x.shape[1], 3, dtype=x.dtype)
        count = min(3, vh.shape[0])
        axes[:, :count] = canonical_signs(vh[:count].T)
        components = centered @ axes
        median = components.median(0).values
        deviation = (components - median).abs().median(0).values
        low, high = median - spread * deviation, median + spread * deviation
        flat = high - low <= 0  # constant component: map it to mid-grey
        low, high = torch.where(flat, median - 1, low), torch.where(flat, median + 1, high)
        return cls(mean.float(), axes.float(), low.float(), high.float())

    def __call__(self, features: Tensor) -> Tensor:
        """``features [h, w, C]`` -> RGB ``[3, h, w]`` in ``[0, 1]``."""
        components = (features.float().cpu() - self.mean) @ self.axes
        rgb = ((components - self.low) / (self.high - self.low)).clamp(0, 1)
        return rgb.permute(2, 0, 1)


def pca_image(features: Tensor, size: tuple[int, int] | None = None) -> Tensor:
    """RGB ``[3, H, W]`` in ``[0, 1]`` of ``features [h, w, C]``, nearest-upsampled to ``size``."""
    rgb = PCAColors.fit(features)(features)
    return _upsample(rgb, size)


def _upsample(rgb: Tensor, size: tuple[int, int] | None) -> Tensor:
    if size is None or tuple(rgb.shape[1:]) == tuple(size):
        return rgb
    return F.interpolate(rgb[None], size=size, mode="nearest")[0]


class PCAFeatureImages(Evaluation):
    """PCA images of a fixed set of images, for the backbone and every teacher head.

    Logs, for image ``i``: ``eval/pca/<i>/input`` (the image as the student sees it),
    ``eval/pca/<i>/backbone`` (the student's own patch features), and for each teacher
    ``eval/pca/<i>/<teacher>``: the student's head features on the left, the teacher's own
    features (same colours) on the right. Each panel is ``display`` pixels high.

    Cost per image: one student forward at ``resolution`` and one teacher forward each
    (teachers are run once and cached), plus an SVD of ``[h*w, C]`` per panel.

    Args:
        images: folder of images, or ``"radio_lit:sample_images"`` (the shipped photographs).
        num_images: how many (the first in sorted order).
        crop_size: resize (short side) and center-crop to this side.
        resolution: student input side; default the model's training resolution.
        display: panel side in pixels (features are upsampled by nearest neighbour).
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    def __init__(
        self,
        images: str = SAMPLE_IMAGES,
        num_images: int = 4,
        crop_size: int = 224,
        resolution: int | None = None,
        display: int = 128,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        self.images, self.num_images = images, num_images
        self.crop_size, self.resolution, self.display = crop_size, resolution, display
        self._teachers: dict[str, Tensor] | None = None

    def evaluate(self, view: ModelView) -> Report:
        dataset = unlabeled_images(self.images, self.crop_size, self.num_images)
        device = view.device
        # Every rank runs the same images (the panels are small; FSDP needs every rank).
        images = torch.stack([dataset[i] for i in range(len(dataset))])
        images = as_float_images(images.to(device))
        outputs = view(images, self.resolution)
        if self._teachers is None:
            self._teachers = {n: o.features.cpu() for n, o in view.teacher_outputs(images).items()}
        size = (self.display, self.display)
        report = Report()
        for i in range(images.shape[0]):
            tag = f"eval/pca/{i}"
            report.images[f"{tag}/input"] = resize_view(images[i : i + 1], size)[0].cpu()
            for name, out in outputs.items():
                student = out.features[i].cpu()
                if name == BACKBONE or name not in self._teachers:
                    report.images[f"{tag}/{name}"] = pca_image(student, size)
                    continue
                teacher = self._teachers[name][i]
                colors = PCAColors.fit(teacher)
                report.images[f"{tag}/{name}"] = torch.cat(
                    [_upsample(colors(student), size), _upsample(colors(teacher), size)], dim=2
                )
        return report
