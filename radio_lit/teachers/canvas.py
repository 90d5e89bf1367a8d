"""Teachers with one fixed input size, fed by pad-and-crop or mosaics (SAM, SAM2, SAM3).

PHI-S section 3: SAM's features degrade when resampled, and its encoder is built for one
input size, so a smaller view is zero-padded bottom/right to the encoder's size (the
*canvas*) and the features of the unpadded region are cropped out, never interpolated; with
``mosaic``, ``k x k`` views share one canvas (RADIOv2.5 4.3,
:mod:`radio_lit.teachers.mosaic`).

A declared convention for SAM2 and SAM3 (:mod:`radio_lit.teachers.sam_hf`): SAM's own
preprocessing pads an image to its square input, so padding is what SAM saw in training, but
SAM2's and SAM3's image processors resize the whole image to the canvas. Pad-and-crop and
mosaics therefore feed these two encoders zero bands (zero after normalization: the mean
colour) that they never saw; the features kept are the view's own cells, cropped, never
interpolated. A view as large as the canvas has no band.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.mosaic import mosaic_layout, pack, unpack


class CanvasTeacher(Teacher):
    """Features-only teacher whose encoder takes ``canvas x canvas`` inputs.

    Subclasses implement :meth:`encode_canvas`. A view ``[B, 3, H, W]`` with
    ``H, W <= canvas`` (multiples of the patch size) gives ``features [B, H/p, W/p, C]``, the
    top-left cells of the canvas's grid, and ``summary=None``.

    Args:
        resolution: side of the view (pixels), at most ``canvas``.
        canvas: the encoder's input side (pixels).
        patch_size, mean, std, follow_student: see :class:`Teacher`.
        mosaic: pack ``k x k`` square views per canvas (``k = canvas // side``) instead of
            padding each view alone: ``ceil(B / k^2)`` encoder runs instead of ``B``.
    """

    has_summary = False
    interpolatable = False

    def __init__(
        self,
        resolution: int,
        canvas: int,
        patch_size: int,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
        follow_student: bool,
        mosaic: bool,
    ) -> None:
        if resolution > canvas:
            raise ValueError(
                f"{type(self).__name__} resolution {resolution} exceeds the encoder's input "
                f"size {canvas}; views are padded up to it, never shrunk: the nearest valid "
                f"resolution is {canvas}."
            )
        super().__init__(resolution, patch_size, mean, std, follow_student)
        self.canvas = canvas
        self.mosaic = mosaic

    @property
    def summary_dim(self) -> None:
        return None

    def shares_canvas(self, size: tuple[int, int]) -> bool:
        """Mosaics pack ``k x k > 1`` views per canvas (global attention mixes them)."""
        height, width = size
        if not self.mosaic or height != width:
            return False
        return mosaic_layout(height, self.canvas, self.patch_size).k > 1

    def encode_canvas(self, images: Tensor) -> Tensor:
        """``[B, 3, canvas, canvas]`` -> features ``[B, canvas/p, canvas/p, C]``."""
        raise NotImplementedError

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, H, W]`` -> features ``[B, H/p, W/p, C]`` via pad-and-crop or mosaic."""
        height, width = view.shape[-2:]
        canvas, patch = self.canvas, self.patch_size
        if height > canvas or width > canvas or height % patch or width % patch:
            raise ValueError(
                f"{type(self).__name__} got a {height}x{width} px view; its encoder takes "
                f"multiples of {patch} px up to {canvas} px (a student resolution above "
                f"{canvas} cannot be matched against it without interpolation)"
            )
        if self.mosaic and height == width:
            layout = mosaic_layout(height, canvas, patch)
            if layout.k > 1:
                features = self.encode_canvas(pack(view, layout))
                return TeacherOutput(summary=None, features=unpack(features, layout, len(view)))
        # zeros = the mean pixel after normalization
        padded = F.pad(view, (0, canvas - width, 0, canvas - height))
        features = self.encode_canvas(padded)
        return TeacherOutput(
            summary=None, features=features[:, : height // patch, : width // patch]
        )
