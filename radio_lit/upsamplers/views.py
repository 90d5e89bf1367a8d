"""Jittered views with known transforms, and the prediction warped into them (FeatSharp paper
3.4; notes 4.4 "Views").

Each image gets ``n`` views, each a small random homography of it: zoom within ±5 %, rotation
within ±5°, a perspective distortion. kornia's augmentations draw them on the device and
return each view's ``3 x 3`` matrix (image pixels -> view pixels, pixel centres at integer
coordinates); kornia's ``warp_perspective`` applies a matrix to a feature map once it is
expressed in that map's cells (:func:`cell_matrix`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["JitteredViews", "cell_matrix", "warp_cells"]


class JitteredViews(nn.Module):
    """``count`` random views of each image and their transform matrices.

    Args:
        count: views per image [notes 4.4: 5].
        degrees: largest rotation [notes 4.4: 5°].
        zoom: largest relative zoom [notes 4.4: 5 %].
        perspective: kornia's ``distortion_scale`` (corners move by up to this share of half
            the side, uniformly: the notes' 0.01-0.05 as kornia draws it [choice]).
    """

    def __init__(
        self, count: int = 5, degrees: float = 5.0, zoom: float = 0.05, perspective: float = 0.05
    ) -> None:
        super().__init__()
        if count < 1:
            raise ValueError(f"JitteredViews: count must be at least 1, got {count}")
        self.count = count
        import kornia.augmentation as K  # kornia is imported by FeatSharp's training only

        self.augment = K.AugmentationSequential(
            K.RandomAffine(degrees, scale=(1 - zoom, 1 + zoom), p=1.0),
            K.RandomPerspective(perspective, p=1.0),
        )

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``images [B, 3, S, S]`` in ``[0, 1]`` -> views ``[B n, 3, S, S]`` (image ``i``'s
        views at rows ``i n .. i n + n - 1``) and their matrices ``[B n, 3, 3]`` (pixels)."""
        repeated = images.repeat_interleave(self.count, 0)
        matrices = self.transforms(repeated)
        # one warp by the composed matrix, reflecting at the border [choice] (the objective
        # weighs the part of a view the image covers)
        size = (images.shape[-2], images.shape[-1])
        from kornia.geometry.transform import warp_perspective

        views = warp_perspective(
            repeated, matrices, size, padding_mode="reflection", align_corners=True
        )
        return views, matrices

    def transforms(self, images: Tensor) -> Tensor:
        """One view's transform of each of ``images [N, 3, S, S]`` (only their shape, dtype and
        device are read: an expanded scalar will do), drawn from torch's default generator:
        ``[N, 3, 3]`` (pixels).

        The transforms are drawn and composed without being applied: kornia's forward would
        warp every view twice more (as much as the view's own warp each) only for the images
        to be thrown away; the same draws from the same generator state."""
        params = self.augment.forward_parameters(images.shape)
        matrices = self.augment.get_transformation_matrix(images, params, recompute=True)
        return matrices.to(images.dtype)


def cell_matrix(matrix: Tensor, cell: float) -> Tensor:
    """A pixel-space transform ``[N, 3, 3]`` in the cells of a map whose cells are ``cell``
    pixels wide: ``S⁻¹ M S`` with ``S`` the cell -> pixel map ``x = cell · u + (cell - 1) / 2``
    (cell centres to pixel centres)."""
    scale = torch.tensor(
        [[cell, 0.0, (cell - 1) / 2], [0.0, cell, (cell - 1) / 2], [0.0, 0.0, 1.0]],
        dtype=matrix.dtype,
        device=matrix.device,
    )
    return torch.linalg.inv(scale) @ matrix @ scale


def warp_cells(
    features: Tensor, matrix: Tensor, cell: float, padding_mode: str = "reflection"
) -> Tensor:
    """``features [N, C, h, w]`` of the image warped into the views' frames by the pixel
    transforms ``matrix [N, 3, 3]``, each cell ``cell`` pixels wide (kornia's
    ``warp_perspective``, bilinear)."""
    size = (features.shape[-2], features.shape[-1])
    warp = cell_matrix(matrix, cell)
    from kornia.geometry.transform import warp_perspective

    return warp_perspective(features, warp, size, padding_mode=padding_mode, align_corners=True)
