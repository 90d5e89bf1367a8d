"""Float64 state that a module's dtype casts leave alone.

Statistics, composed head spaces and the pixel conditioner are kept in float64 so that what
they fold stays exact; ``module.to(torch.bfloat16)`` (Lightning's ``bf16-true``) must move them
between devices but never round them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def keeping_float64(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """``fn`` (an ``nn.Module._apply`` function) that moves a float64 tensor but keeps its
    dtype; other tensors get ``fn`` as it is."""

    def apply(t: Tensor) -> Tensor:
        out = fn(t)
        return out if t.dtype != torch.float64 or out.dtype == t.dtype else t.to(out.device)

    return apply
