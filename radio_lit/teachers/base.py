"""The Teacher contract: a frozen vision encoder that returns a summary and dense features.

AM-RADIO section 3.4: each teacher k yields a summary vector ``z_k^(s)`` (the CLIP image
embedding, the DINOv2 CLS token, nothing for SAM) and spatial features ``z_k^(v)``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from radio_lit.core.outputs import TeacherOutput
from radio_lit.data.views import teacher_view
from radio_lit.teachers.speed import EncoderRunner, TeacherSpeed

# Lightning's summary of a fit counts modules in eval mode: teachers are, by design (train).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


class Teacher(nn.Module):
    """Frozen encoder with a known input resolution, patch size and pixel normalization.

    Subclasses build ``self.model`` and implement :meth:`encode`, which maps a normalized
    view ``[B, 3, resolution, resolution]`` to a :class:`TeacherOutput`. The base class keeps
    the teacher frozen: parameters never require grad, ``train()`` leaves it in eval mode,
    and its weights are left out of ``state_dict()`` (they reload from their source, so
    training checkpoints stay the student's size).

    Building a teacher leaves the global random state as it found it (every subclass's
    ``__init__`` runs under :func:`torch.random.fork_rng`; random weights still come from
    that state): the student, the heads and the steps draw the same numbers whether the
    teachers are built or their outputs are read from a cache (:mod:`radio_lit.cache`).

    Args:
        resolution: side of the square view the teacher sees (pixels); its native resolution.
        patch_size: pixels per feature cell of the teacher's output grid.
        mean: per-channel pixel mean used to normalize the view (RGB, 0-1 scale).
        std: per-channel pixel std.
        follow_student: see the student's grid instead of the native resolution: the view is
            ``student grid x patch_size`` pixels per side, so both grids match (RADIOv2.5 4.2:
            DINOv2 "can infer images at any resolution"; CLIP teachers keep their native one).
    """

    has_summary: bool = True
    #: Whether the loss may resample this teacher's features (SAM: no, PHI-S 3).
    interpolatable: ClassVar[bool] = True
    #: Whether the teacher can run on images (``False``: its outputs come from a cache).
    live: ClassVar[bool] = True
    #: Whether convolution weights and views are held channels-last (:meth:`freeze`).
    channels_last: bool = False
    #: How :meth:`run_encoder` calls :meth:`encode` with the teacher's speed options
    #: (:mod:`radio_lit.teachers.speed`); ``None``: plainly.
    speed_runner: EncoderRunner | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _keeps_random_state(cls.__init__)  # type: ignore[method-assign]

    def __init__(
        self,
        resolution: int,
        patch_size: int,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
        follow_student: bool = False,
    ) -> None:
        super().__init__()
        if resolution % patch_size:
            raise ValueError(
                f"{type(self).__name__}: resolution {resolution} is not a multiple of the "
                f"patch size {patch_size}; the nearest valid one is "
                f"{nearest_multiple(resolution, patch_size)}."
            )
        self.resolution = resolution
        self.patch_size = patch_size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.follow_student = follow_student

    # -- dimensions -------------------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        """Channel count ``C`` of :attr:`TeacherOutput.features`."""
        raise NotImplementedError

    @property
    def summary_dim(self) -> int | None:
        """Channel count of :attr:`TeacherOutput.summary`, ``None`` without a summary."""
        raise NotImplementedError

    @property
    def backbone_of(self) -> str | None:
        """The model whose own backbone output this teacher is (a RADIO model's, for a
        student that starts as that model: ``model.init_from``), else ``None``."""
        return None

    @property
    def grid_size(self) -> tuple[int, int]:
        """``(H, W)`` of the feature map for a full view."""
        side = self.resolution // self.patch_size
        return side, side

    def view_size(self, student_grid: tuple[int, int]) -> tuple[int, int]:
        """``(H, W)`` pixels of this teacher's view when the student's grid is ``student_grid``:
        the native resolution, or ``student_grid * patch_size`` with ``follow_student``."""
        if self.follow_student:
            return student_grid[0] * self.patch_size, student_grid[1] * self.patch_size
        return self.resolution, self.resolution

    def shares_canvas(self, size: tuple[int, int]) -> bool:
        """Whether views of ``size = (H, W)`` pixels share an encoder input with other views of
        the batch (a mosaic), so that a view's outputs depend on its batch neighbours."""
        return False

    # -- frozen behaviour -------------------------------------------------------------------
    def freeze(self, channels_last: bool = False, speed: TeacherSpeed | None = None) -> None:
        """Drop gradients and switch to eval; called by subclasses once weights are loaded.

        ``channels_last`` also stores the 4-D weights (convolutions: patch embeddings, conv
        stems and stages, necks) in channels-last memory format (NHWC strides, same shapes and
        values), and :meth:`forward` hands the encoder channels-last views: cuDNN's and
        oneDNN's convolutions then run on NHWC directly (no layout transposes around each
        convolution) and write NHWC outputs, whose ``[B, h, w, C]`` token view needs no copy.

        ``speed`` applies the teacher's speed options to its encoder ``self.model``
        (:class:`~radio_lit.teachers.speed.TeacherSpeed`: FP8 now, compilation at the first
        call, the attention backend at every call; docs/speed.md).
        """
        self.requires_grad_(False)
        super().train(False)
        if channels_last:
            self.to(memory_format=torch.channels_last)
            self.channels_last = True
        if speed is not None:
            self.speed_runner = EncoderRunner(
                self.encode, getattr(self, "model", self), speed, type(self).__name__
            )

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``model.compile`` (:func:`radio_lit.core.compiling.compile_models`): ``torch.compile`` of
        the encoder call (not the view) with static shapes unless ``dynamic`` is given, as
        ``speed.compile`` does; a teacher's own ``speed.compile`` (``false`` included) wins."""
        if self.speed_runner is None:
            self.speed_runner = EncoderRunner(
                self.encode, self, TeacherSpeed(), type(self).__name__
            )
        if self.speed_runner.speed.compile is None:
            self.speed_runner.compile(dict(kwargs) or True)

    def run_encoder(self, view: Tensor) -> TeacherOutput:
        """:meth:`encode` with the teacher's speed options (``speed``; :meth:`freeze`)."""
        if self.speed_runner is None:
            return self.encode(view)
        return self.speed_runner(view)

    def train(self, mode: bool = True) -> Teacher:
        """Teachers stay in eval mode whatever the parent module asks."""
        return super().train(False)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """Teachers are not checkpointed: their weights come from their own source.

        The owning :class:`~radio_lit.module.DistillationModule` gives them their own
        weights back when it loads a checkpoint
        (:func:`radio_lit.export.checkpoint.keep_teacher_weights`).
        """
        destination = kwargs.get("destination")
        return {} if destination is None else destination

    # -- forward ----------------------------------------------------------------------------
    def view(self, crop: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        """Teacher input from the shared crop ``[B, 3, h, w]`` in ``[0, 1]``.

        Returns ``[B, 3, H, W]`` (``size``, by default ``resolution`` squared), resized and
        normalized by mean/std.
        """
        return teacher_view(crop, size or self.resolution, self.mean, self.std)

    def encode(self, view: Tensor) -> TeacherOutput:
        """Run the encoder on a normalized view ``[B, 3, R, R]``."""
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, crop: Tensor, size: tuple[int, int] | None = None) -> TeacherOutput:
        """Crop ``[B, 3, h, w]`` in ``[0, 1]`` -> :class:`TeacherOutput` (no grad); ``size``
        is the view's ``(H, W)`` (default: the native resolution, see :meth:`view_size`).

        A teacher held in a lower precision (``dtype: bfloat16``) gets its view in that
        precision, runs in it with autocast disabled and returns float32 outputs, so the
        targets' statistics are unaffected. Without autocast its layer norms and softmaxes run
        in its own dtype (accumulating in float32 inside the kernels), not as the float32
        islands that a surrounding ``bf16-mixed`` autocast would make of them, each with casts
        of its input, weight and bias and back (docs/teachers.md). A float32 teacher
        keeps the caller's autocast (its matrix products then run in bf16).
        """
        view = self.view(crop, size)
        if self.channels_last:
            view = view.contiguous(memory_format=torch.channels_last)
        weight = next(self.parameters(), None)
        if weight is None or weight.dtype in (torch.float32, torch.float64):
            return self.run_encoder(view)
        with torch.autocast(view.device.type, enabled=False):
            out = self.run_encoder(view.to(weight.dtype))
        summary = None if out.summary is None else out.summary.float()
        return TeacherOutput(summary=summary, features=out.features.float())


def _keeps_random_state(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` run under :func:`torch.random.fork_rng` (CPU generator): it may draw random
    weights, and the global state is restored afterwards."""

    @functools.wraps(init)
    def wrapped(self: Teacher, *args: Any, **kwargs: Any) -> None:
        with torch.random.fork_rng(devices=[]):
            init(self, *args, **kwargs)

    return wrapped


def nearest_multiple(value: int, step: int) -> int:
    """The positive multiple of ``step`` closest to ``value`` (ties go up)."""
    return max(step, (value + step // 2) // step * step)
