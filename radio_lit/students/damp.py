"""DAMP: multiplicative weight noise on the student's weights (C-RADIOv4 report 2.4; Trinh et
al., NeurIPS 2024, "Improving robustness to corruptions with multiplicative weight
perturbations"; notes 2.5).

During a training forward each perturbed layer applies ``W ⊙ ξ`` with ``ξ ~ N(1, σ²)`` drawn
per weight element, a fresh draw per forward (a sub-batch: each chunk's student forward on each
rank), on weights, not biases. Off at evaluation. Which weights (notes 2.5):

- every ``nn.Linear`` (NVlabs' ``enable_damp`` registers DAMP on each, their patch embedder
  included, a ``Linear`` there) and every ``nn.Conv2d`` kernel (the DAMP paper perturbs
  kernels; here the CPE ViT's patch embedding is a ``Conv2d``, and E-RADIO's stages are
  convolutions);
- norm scales only with ``norm_scales`` ``[choice]``: the DAMP paper perturbs them, NVlabs'
  code (C-RADIOv4's own) does not, so they are off by default;
- never biases.

Draws: torch's default generators at the time of the forward. In a training step these are
this rank's own stream (:class:`~radio_lit.training.student_step.StudentStep`: seeded from the
run's seed
and the global rank, in every checkpoint), so every rank draws its own noise, and a resumed run
draws the noise the interrupted one would have. ``[choice]`` ξ is drawn per layer as the layer
runs, in the order the layers run.

Composition with σReparam: ``W`` is the weight the layer actually applies, its
``effective_weight()`` when it has one (:class:`~radio_lit.students.spectral_reparam.
SpectralLinear`, ``γ/σ(W) · W``: inside a training step the step's weight, computed once with
all layers' by :func:`~radio_lit.students.spectral_reparam.spectral_step`), else ``weight``.
Inside :meth:`DAMP.noise` each perturbed layer's forward is its functional form on the noisy
weight (an instance ``forward`` that shadows the class's until the context ends; a compiled
student keeps one graph across steps): each layer's product runs once, on the noisy weight. It
reads the weight through that public accessor only, so σReparam's internals are untouched, and
its power iteration never sees noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DAMP", "weight_noise"]


def _noisy_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """A linear layer's forward under :meth:`DAMP.noise`, ``[..., in] -> [..., out]``:
    ``F.linear(x, W ⊙ ξ, b)``, ``W`` the weight it applies (σReparam's effective weight)."""
    effective = getattr(layer, "effective_weight", None)
    weight = effective() if callable(effective) else layer.weight
    return F.linear(x, layer.damp.apply(weight), layer.bias)


def _noisy_conv(layer: nn.Conv2d, x: Tensor) -> Tensor:
    """A convolution's forward under :meth:`DAMP.noise`: its kernel ``W ⊙ ξ``, bias as is."""
    return layer._conv_forward(x, layer.damp.apply(layer.weight), layer.bias)


def _noisy_norm(layer: nn.LayerNorm, x: Tensor) -> Tensor:
    """A LayerNorm's forward under :meth:`DAMP.noise` with ``norm_scales``: scale ``γ ⊙ ξ``."""
    scale = layer.damp.apply(layer.weight)
    return F.layer_norm(x, layer.normalized_shape, scale, layer.bias, layer.eps)


class DAMP:
    """Multiplicative Gaussian weight noise ``ξ ~ N(1, std²)`` (``model.damp``).

    Args:
        std: ``σ``. The report gives none; DAMP's ViT configurations use 0.1-0.25, and the
            default 0.1 is this project's ``[choice]``.
        norm_scales: also perturb the scales of ``LayerNorm`` layers (the DAMP paper's rule;
            ``False``, NVlabs' and the default, ``[choice]``).
    """

    def __init__(self, std: float = 0.1, norm_scales: bool = False) -> None:
        if not std > 0.0:
            raise ValueError(f"model.damp.init_args.std must be > 0, got {std}")
        self.std = std
        self.norm_scales = norm_scales

    def layers(self, module: nn.Module) -> list[tuple[nn.Module, Callable[..., Tensor]]]:
        """The layers of ``module`` DAMP perturbs, each with its noisy forward (module
        docstring): linear layers, 2-D convolutions, and layer norms with an affine scale when
        ``norm_scales``."""
        found: list[tuple[nn.Module, Callable[..., Tensor]]] = []
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                found.append((layer, _noisy_linear))
            elif isinstance(layer, nn.Conv2d):
                found.append((layer, _noisy_conv))
            elif self.norm_scales and isinstance(layer, nn.LayerNorm) and layer.weight is not None:
                found.append((layer, _noisy_norm))
        return found

    @contextmanager
    def noise(self, module: nn.Module) -> Iterator[None]:
        """Every layer :meth:`layers` names applies noisy weights inside the context."""
        layers = self.layers(module)
        for layer, forward in layers:
            layer.damp = self
            layer.forward = MethodType(forward, layer)  # (torch.compile: one graph)
        try:
            yield
        finally:
            for layer, _ in layers:
                del layer.forward, layer.damp  # the class's forward again

    def apply(self, weight: Tensor) -> Tensor:
        """``W ⊙ ξ`` for ``weight`` of any shape: ``ξ ~ N(1, σ²)`` per element, a fresh draw."""
        xi = torch.randn(weight.shape, device=weight.device).mul_(self.std).add_(1.0)
        return weight * xi.to(weight.dtype)

    def __repr__(self) -> str:
        return f"DAMP(std={self.std}, norm_scales={self.norm_scales})"


def weight_noise(damp: DAMP | None, module: nn.Module, training: bool) -> Any:
    """``damp.noise(module)`` in training with DAMP on, else a context that does nothing."""
    return damp.noise(module) if damp is not None and training else nullcontext()
