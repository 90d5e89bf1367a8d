"""A family teacher that runs on timm or transformers (DINOv2, DINOv3): one preset class,
two generic backends (:mod:`radio_lit.teachers.timm_teacher`,
:mod:`radio_lit.teachers.transformers_teacher`).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from torch import Tensor

from radio_lit.teachers.loading import TeacherDtype, cast
from radio_lit.teachers.speed import TeacherSpeed
from radio_lit.teachers.timm_teacher import build_timm, timm_layout, timm_tokens
from radio_lit.teachers.tokens import TokenTeacher
from radio_lit.teachers.transformers_teacher import (
    build_transformers,
    square_side,
    transformers_layout,
    transformers_tokens,
)


class TwoBackendTeacher(TokenTeacher):
    """Class-token ViT family on timm or transformers; subclasses name the family.

    Summary: the class token after the final norm; features: the normed patch tokens,
    class and register tokens dropped.

    Class attributes:
        model_types: transformers model types of the family.
        timm_pattern: ``timm.list_models`` pattern of the family (for messages).
        wrong_family: ``(substring of a model id, teacher class to use instead)`` pairs
            checked on the given name before anything is built or downloaded.
    """

    model_types: ClassVar[tuple[str, ...]] = ()
    timm_pattern: ClassVar[str] = "*"
    wrong_family: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(
        self,
        model: str,
        backend: Literal["timm", "transformers"] = "timm",
        pretrained: bool = True,
        checkpoint: str | None = None,
        resolution: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        trust_remote_code: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        name = type(self).__name__
        for fragment, other in self.wrong_family:
            if fragment in model.lower() and not os.path.exists(model):
                raise ValueError(
                    f"{model!r} is not a model {name} runs; use "
                    f"radio_lit.teachers.{other} (class_path) for it."
                )
        kwargs = dict(model_kwargs or {})
        if backend == "timm":
            if follow_student:
                kwargs["dynamic_img_size"] = True
            net = build_timm(
                name, model, pretrained, checkpoint, resolution, kwargs, self.timm_pattern
            )
            if getattr(net, "cls_token", None) is None:
                raise TypeError(f"{name} needs a timm ViT with a class token, got {model!r}.")
            layout = timm_layout(name, net, model, "cls", None, None)
            net = cast(net, dtype)
            self._native = layout.resolution
        elif backend == "transformers":
            if checkpoint is not None:
                raise ValueError(
                    "checkpoint is a timm file; with the transformers backend give the "
                    "directory written by save_pretrained as model."
                )
            net, config = build_transformers(
                name, model, pretrained, kwargs, trust_remote_code, self.model_types, dtype
            )
            layout = transformers_layout(name, model, config, resolution, "cls", None, None)
            self._native = square_side(config.image_size)
        else:
            raise ValueError(f"unknown backend {backend!r}; use 'timm' or 'transformers'.")
        super().__init__(layout, follow_student)
        self.backend = backend
        self.model = net
        self.freeze(channels_last, speed)

    def tokens(self, view: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.backend == "timm":
            return timm_tokens(self.model, view, "cls")
        return transformers_tokens(self.model, view, self._native)
