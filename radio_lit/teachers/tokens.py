"""ViT teachers whose encoder returns one token sequence: prefix tokens, then patch tokens.

AM-RADIO section 3.4: the summary is an image-level vector (a class token, or a pooled
embedding such as SigLIP's attention pool), the features are the patch tokens. The number of
prefix tokens (class token and registers) is read from the encoder's output, never assumed:
``prefix = tokens - (H / p) (W / p)`` for a view ``[B, 3, H, W]``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from torch import Tensor

from radio_lit.teachers.base import Teacher, TeacherOutput

#: Where a token teacher's summary comes from: its class token (after the final norm), the
#: library's pooled output (an attention pool, SigLIP), or nothing.
SummarySource = Literal["cls", "pooled", "none"]


class TokenLayout(NamedTuple):
    """What a token teacher reads from its built encoder.

    Attributes:
        resolution: native input side (pixels).
        patch_size: pixels per token.
        mean: pixel mean (0-1 scale).
        std: pixel std.
        feature_dim: channels ``C`` of the patch tokens.
        summary_dim: channels of the summary.
        summary: where the summary comes from (:data:`SummarySource`).
        num_prefix_tokens: class and register tokens in front of the patches, checked
            against every output; ``None``: counted from each output.
    """

    resolution: int
    patch_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    feature_dim: int
    summary_dim: int
    summary: SummarySource
    num_prefix_tokens: int | None


class TokenTeacher(Teacher):
    """Base of the timm and transformers teachers: :meth:`tokens` runs the encoder.

    Args:
        layout: the encoder's :class:`TokenLayout`.
        follow_student: see :class:`Teacher`.
    """

    def __init__(self, layout: TokenLayout, follow_student: bool) -> None:
        super().__init__(
            layout.resolution, layout.patch_size, layout.mean, layout.std, follow_student
        )
        self.summary_source = layout.summary
        self.has_summary = layout.summary != "none"
        self.num_prefix_tokens = layout.num_prefix_tokens
        self._feature_dim = layout.feature_dim
        self._summary_dim = layout.summary_dim if self.has_summary else None

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    @property
    def summary_dim(self) -> int | None:
        return self._summary_dim

    def tokens(self, view: Tensor) -> tuple[Tensor, Tensor | None]:
        """``[B, 3, H, W]`` -> (tokens ``[B, prefix + HW/p^2, C]`` as the model returns them, normed
        or not (see the subclasses), pooled summary
        ``[B, C_s]`` or ``None`` when the library has no pooled output)."""
        raise NotImplementedError

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, H, W]`` -> summary ``[B, C_s]`` (or ``None``), features ``[B, H/p, W/p, C]``."""
        tokens, pooled = self.tokens(view)
        batch, _, height, width = view.shape
        rows, cols = height // self.patch_size, width // self.patch_size
        prefix = tokens.shape[1] - rows * cols
        if self.num_prefix_tokens is not None and prefix != self.num_prefix_tokens:
            raise RuntimeError(
                f"{type(self).__name__}: {tokens.shape[1]} tokens for a {rows}x{cols} grid, "
                f"expected {self.num_prefix_tokens} prefix tokens"
            )
        features = tokens[:, prefix:].reshape(batch, rows, cols, -1)
        if self.summary_source == "cls" and prefix == 0:  # the first token is a patch
            raise RuntimeError(
                f"{type(self).__name__}: summary: cls on a model without a class token "
                f"({tokens.shape[1]} tokens, all patches of the {rows}x{cols} grid); use "
                "summary: pooled or summary: none"
            )
        if self.summary_source == "cls":
            summary = tokens[:, 0]
        elif self.summary_source == "pooled":
            summary = pooled
        else:
            summary = None
        return TeacherOutput(summary=summary, features=features)


def default_summary(has_class_token: bool) -> SummarySource:
    """The class token where there is one, else the library's pooled output."""
    return "cls" if has_class_token else "pooled"
