"""Building a run as ``radio-lit fit`` builds it, its large models on the meta device.

``radio-lit plan`` parses a config with radio-lit's own CLI and builds every configured class;
:func:`on_meta` is the instantiator it gives the parser for teachers and students: each is
constructed under ``torch.device("meta")`` (shapes and dtypes only: a DINOv3-7B costs no
memory and no initialisation). What a construction computes from data stays real:

- a wrapper teacher (``UpsampledTeacher``: FeatSharp) is built on the host around its meta
  teacher (its upsampler is small), with its untrained upsampler's calibration features taken
  as zeros and its normalizer marked fitted without a fit (:func:`planning_build`) [choice:
  the upsampler's cost does not depend on its statistics; the calibration would run the teacher
  on data];
- a library that moves its freshly built model to the host (open_clip's ``create_model``)
  keeps it on the meta device (:func:`_meta_stays`);
- the data module is the config's crop and batch on synthetic images (``cli/plan.py``): the
  plan reads no data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import nn

__all__ = ["on_meta", "planning_build"]


def _meta_stays(original: Any) -> Any:
    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        moving = device is not None and device.type != "meta"
        if moving and any(t.is_meta for t in self.parameters()):
            return original(self, dtype) if dtype is not None else self
        return original(self, *args, **kwargs)

    return to


def on_meta(class_type: type, *args: Any, **kwargs: Any) -> Any:
    """``class_type(*args, **kwargs)`` on the meta device (a jsonargparse instantiator for
    teachers and students); a teacher that wraps a built teacher (``teacher=``) on the host."""
    if isinstance(kwargs.get("teacher"), nn.Module):
        return class_type(*args, **kwargs)
    with mock.patch.object(nn.Module, "to", _meta_stays(nn.Module.to)), torch.device("meta"):
        return class_type(*args, **kwargs)


@contextlib.contextmanager
def planning_build() -> Iterator[None]:
    """While a plan's run is built: untrained upsamplers calibrated on zeros, normalizers
    marked fitted without a fit (see the module docstring)."""
    import radio_lit.upsamplers.teacher as upsampled
    from radio_lit.normalizers.base import Normalizer

    def features(teacher: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(4, teacher.feature_dim, device="cpu")

    with (
        mock.patch.object(upsampled, "calibration_features", features),
        mock.patch.object(Normalizer, "fit", lambda self: self._set_fitted(True)),
    ):
        yield
