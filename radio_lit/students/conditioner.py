"""The student's pixel normalization as state of the run (NVlabs' ``input_conditioner``).

A student sees ``(x - mean) / std`` of its ``[0, 1]`` view, per channel. The statistics come
from ``model.student_mean``/``student_std``, the student's own default, or the published
model a run starts from (``model.init_from``: NVlabs' ``input_conditioner.norm_mean`` and
``norm_std``, which need not be the student class's default). They are buffers of the
training module (``conditioner.mean``, ``conditioner.std``, float64 ``[3]``), so that a
checkpoint, every export written from it, ``radio_lit.load`` of it and a next stage's
``init_from`` carry the statistics the model was trained with, not the config's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from radio_lit.core.dtypes import keeping_float64

Triple = tuple[float, ...]


class StudentConditioner(nn.Module):
    """The pixel ``mean`` and ``std`` ``[3]`` a student's input is normalized with.

    :attr:`values` is the pair as Python tuples, what the views are built from (no device
    round trip per step); it follows every :meth:`set` and every state-dict load.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(tuple(mean), dtype=torch.float64))
        self.register_buffer("std", torch.tensor(tuple(std), dtype=torch.float64))
        self.values: tuple[Triple, Triple] = (tuple(mean), tuple(std))

    @classmethod
    def of(
        cls, student: Any, mean: Sequence[float] | None, std: Sequence[float] | None
    ) -> StudentConditioner:
        """``model.student_mean``/``student_std``, each by default the student's own
        (``pixel_mean``/``pixel_std``: its timm pretrained config's)."""
        return cls(mean or student.pixel_mean, std or student.pixel_std)

    @torch.no_grad()
    def set(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Normalize with ``mean`` and ``std`` from now on (and in what is saved)."""
        self.mean.copy_(torch.tensor(tuple(mean), dtype=torch.float64))
        self.std.copy_(torch.tensor(tuple(std), dtype=torch.float64))
        self.values = (tuple(float(v) for v in mean), tuple(float(v) for v in std))

    def _load_from_state_dict(
        self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """A checkpoint's statistics become the run's; one written before they were saved
        (no ``conditioner.*``) keeps the configured ones."""
        for name in ("mean", "std"):
            state_dict.setdefault(prefix + name, getattr(self, name).clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.values = (tuple(self.mean.tolist()), tuple(self.std.tolist()))

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> StudentConditioner:
        """Device moves, but no dtype casts (``bf16-true`` would round the statistics)."""
        return super()._apply(keeping_float64(fn), recurse)

    def extra_repr(self) -> str:
        mean, std = self.values
        return f"mean={mean}, std={std}"


#: The keys a training checkpoint holds the conditioner under.
CONDITIONER_KEYS = ("conditioner.mean", "conditioner.std")


def saved_conditioner(state: dict[str, Tensor]) -> tuple[Triple, Triple] | None:
    """The pixel mean and std a training checkpoint's ``state_dict`` holds, or ``None`` for
    one written before they were saved."""
    if not all(key in state for key in CONDITIONER_KEYS):
        return None
    mean, std = (tuple(float(v) for v in state[key].flatten()) for key in CONDITIONER_KEYS)
    return mean, std
