"""The feature normalizers a published RADIO model may ship (radio_v2.5-h-norm and later):
fixed whitening of the backbone's patch features, kept as state of the student (buffers, saved
in every checkpoint and written back by every export in NVlabs' layout).

NVlabs/RADIO facts (``radio/feature_normalizer.py``, ``radio/radio_model.py``
``RADIOModel._extract_final``, ``hubconf.radio_model``): a checkpoint with
``_feature_normalizer.mean [D]`` and ``_feature_normalizer.tx [D, D]`` builds a
``FeatureNormalizer`` that maps the patch features ``f [B, N, D]`` to ``(f - mean) txᵀ``; it
applies to the backbone's features only (not the summary), and the adaptors read the normalized
features. ``_intermediate_feature_normalizer.alphas [L]``, ``.rotation [D, D]`` (or ``[L, D, D]``)
and ``.means [L, D]`` serve NVlabs' ``forward_intermediates`` only; radio-lit has no
intermediate outputs, so they are carried (kept and exported), not applied.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FeatureNormalizer(nn.Module):
    """``(f - mean) txᵀ`` on features ``[..., D]`` (identity until a source's values load)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("tx", torch.eye(dim))

    def forward(self, features: Tensor) -> Tensor:
        return (features - self.mean.to(features.dtype)) @ self.tx.to(features.dtype).T


class IntermediateFeatureNormalizer(nn.Module):
    """The source's intermediate-layer normalizer state (``alphas [L]``, ``rotation [D, D]``
    or ``[L, D, D]``, ``means [L, D]``), carried into every export; not applied (see the
    module docstring)."""

    def __init__(self, count: int, dim: int, rotation_per_layer: bool = False) -> None:
        super().__init__()
        rotation = torch.eye(dim)
        if rotation_per_layer:
            rotation = rotation.expand(count, dim, dim).clone()
        self.register_buffer("alphas", torch.ones(count))
        self.register_buffer("rotation", rotation)
        self.register_buffer("means", torch.zeros(count, dim))
