"""DAMP: multiplicative weight noise on the student's linear layers (C-RADIOv4 report 2.4;
Trinh et al., NeurIPS 2024, "Improving robustness to corruptions with multiplicative weight
perturbations").

During a training forward each linear layer applies ``W ⊙ ξ`` with ``ξ ~ N(1, σ²)`` drawn per
weight element, a fresh draw per forward (a sub-batch: each chunk's student forward on each
rank), on weights, not biases. Off at evaluation. The draws come from torch's global random
state of the step (restored on resume by :class:`~radio_lit.callbacks.RandomStates`), so a
resumed run draws the same noise.

Composition with σReparam: ``W`` is the weight the layer actually applies, its
``effective_weight()`` when it has one (:class:`~radio_lit.students.spectral_reparam.
SpectralLinear`, ``γ/σ(W) · W``: inside a training step the step's weight, computed once with
all layers' by :func:`~radio_lit.students.spectral_reparam.spectral_step`), else ``weight``.
Inside :meth:`DAMP.noise` each linear layer's forward is ``F.linear(x, W ⊙ ξ, b)`` (an instance
``forward`` that shadows the class's until the context ends; a compiled student keeps one
graph across steps): each layer's product runs once, on the noisy weight. It reads the
weight through that public accessor only, so σReparam's internals (how and when it computes
``σ``) are untouched, and its power iteration never sees noise. ``[choice]`` ξ is drawn per
layer as the layer runs (torch's global generator, in the order the layers run), the draws the
earlier implementation made (a forward hook that recomputed each layer's output after the clean
one): the same seed gives the same noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DAMP", "weight_noise"]


class DAMP:
    """Multiplicative Gaussian weight noise ``ξ ~ N(1, std²)`` (``model.damp``).

    Args:
        std: ``σ``. The report gives none; DAMP's ViT configurations use 0.1-0.25, and the
            default 0.1 is this project's ``[choice]``.
    """

    def __init__(self, std: float = 0.1) -> None:
        if not std > 0.0:
            raise ValueError(f"model.damp.init_args.std must be > 0, got {std}")
        self.std = std

    @contextmanager
    def noise(self, module: nn.Module) -> Iterator[None]:
        """Every ``nn.Linear`` of ``module`` applies noisy weights inside the context."""
        layers = [layer for layer in module.modules() if isinstance(layer, nn.Linear)]
        for layer in layers:
            layer.damp = self
            layer.forward = MethodType(_noisy_linear, layer)  # (torch.compile: one graph)
        try:
            yield
        finally:
            for layer in layers:
                del layer.forward, layer.damp  # the class's forward again

    def apply(self, weight: Tensor) -> Tensor:
        """``W ⊙ ξ`` for ``weight [out, in]``: ``ξ ~ N(1, σ²)`` per element, a fresh draw."""
        xi = torch.randn(weight.shape, device=weight.device).mul_(self.std).add_(1.0)
        return weight * xi.to(weight.dtype)

    def __repr__(self) -> str:
        return f"DAMP(std={self.std})"


def _noisy_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """A linear layer's forward under :meth:`DAMP.noise`, ``[..., in] -> [..., out]``:
    ``F.linear(x, W ⊙ ξ, b)``, ``W`` the weight it applies (σReparam's effective weight)."""
    effective = getattr(layer, "effective_weight", None)
    weight = effective() if callable(effective) else layer.weight
    return F.linear(x, layer.damp.apply(weight), layer.bias)


def weight_noise(damp: DAMP | None, module: nn.Module, training: bool) -> Any:
    """``damp.noise(module)`` in training with DAMP on, else a context that does nothing."""
    return damp.noise(module) if damp is not None and training else nullcontext()
