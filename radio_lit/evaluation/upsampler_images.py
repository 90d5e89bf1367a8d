"""Side-by-side PCA images of an upsampler's training (FeatSharp paper, figures 1 and 5).

For each of a few fixed images, one TensorBoard image ``featsharp/pca/<i>``: the teacher at
its resolution, that map bilinearly upsampled, the tile pass (stitched), and FeatSharp's map,
all in the teacher's space and coloured with the same PCA colours (fitted on the teacher's
low-resolution map, :class:`~radio_lit.evaluation.pca.PCAColors`), each panel ``display`` px.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

from radio_lit.data.image_folder import SAMPLE_IMAGES
from radio_lit.data.views import as_float_images
from radio_lit.evaluation.data import unlabeled_images
from radio_lit.evaluation.pca import PCAColors
from radio_lit.upsamplers import FeatSharpModule, teacher_passes

__all__ = ["UpsamplerImages"]

PANELS = ("teacher", "bilinear", "tiles", "featsharp")


class UpsamplerImages(Callback):
    """Log the PCA panels (module docstring) every ``every_n_steps`` and after the last step.

    Args:
        images: folder of images, or ``"radio_lit:sample_images"``.
        num_images: how many (the first in sorted order).
        crop_size: resize (short side) and center-crop to this side.
        display: panel side in pixels.
        every_n_steps: optimizer steps between two logs.
    """

    def __init__(
        self,
        images: str = SAMPLE_IMAGES,
        num_images: int = 2,
        crop_size: int = 224,
        display: int = 128,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__()
        self.images, self.num_images, self.crop_size = images, num_images, crop_size
        self.display, self.every_n_steps = display, every_n_steps

    def panels(self, module: FeatSharpModule) -> dict[str, torch.Tensor]:
        """``{tag: RGB [3, display, 4 display]}`` for every image."""
        dataset = unlabeled_images(self.images, self.crop_size, self.num_images)
        images = as_float_images(torch.stack([dataset[i] for i in range(len(dataset))]))
        images = images.to(module.device)
        upsampler = module.upsampler
        was_training = upsampler.training
        upsampler.eval()
        with torch.no_grad():
            passes = teacher_passes(module.teacher, images, module.factor)
            sharp = upsampler.upsample(module.teacher, images).features
        upsampler.train(was_training)
        size = tuple(sharp.shape[1:3])
        bilinear = F.interpolate(
            passes.low.permute(0, 3, 1, 2), size=size, mode="bilinear", align_corners=False
        ).permute(0, 2, 3, 1)
        side = (self.display, self.display)
        out = {}
        for i in range(images.shape[0]):
            colors = PCAColors.fit(passes.low[i].cpu())
            maps = (passes.low[i], bilinear[i], passes.tiles[i], sharp[i])
            rgb = [F.interpolate(colors(m.cpu())[None], size=side, mode="nearest") for m in maps]
            out[f"featsharp/pca/{i}"] = torch.cat(rgb, 3)[0]
        return out

    def _log(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if not isinstance(module, FeatSharpModule):
            raise TypeError(f"UpsamplerImages needs a FeatSharpModule, got {type(module).__name__}")
        experiment = getattr(trainer.logger, "experiment", None)
        if not trainer.is_global_zero or not hasattr(experiment, "add_image"):
            return
        if not module.upsampler.normalizer.is_fitted:
            return
        for tag, image in self.panels(module).items():
            experiment.add_image(tag, image, trainer.global_step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._log(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step % self.every_n_steps != 0:
            self._log(trainer, pl_module)
