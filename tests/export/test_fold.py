"""PHI-S A.6: a normalizer's inverse folded into the feature head's last linear layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radio_lit.export import fold_affine, fold_normalizer
from radio_lit.normalizers import (
    GlobalStandardize,
    HCAWhiten,
    Identity,
    Normalizer,
    PCAWhiten,
    PhiS,
    Standardize,
    ZCAWhiten,
)
from radio_lit.students import MLPHead

F64 = torch.float64
KINDS = [Identity, GlobalStandardize, Standardize, PhiS, PCAWhiten, ZCAWhiten, HCAWhiten]


def test_fold_affine_matches_eqs_42_43_by_hand() -> None:
    """W = Θ W', b = Θ b' + μ with small integers: W = [[2, 4], [4, 6]], b = [12, 20]."""
    linear = nn.Linear(2, 2).double()
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        linear.bias.copy_(torch.tensor([1.0, -1.0]))
    theta = torch.tensor([[2.0, 0.0], [1.0, 1.0]], dtype=F64)
    mu = torch.tensor([10.0, 20.0], dtype=F64)
    folded = fold_affine(linear, theta, mu)
    assert torch.equal(folded.weight, torch.tensor([[2.0, 4.0], [4.0, 6.0]], dtype=F64))
    assert torch.equal(folded.bias, torch.tensor([12.0, 20.0], dtype=F64))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_folded_head_equals_inverse_of_head(kind: type[Normalizer]) -> None:
    """For every normalizer, ``folded(x) == inverse(head(x))`` to float64 precision."""
    g = torch.Generator().manual_seed(0)
    dim = 12
    mixing = torch.randn(dim, dim, generator=g, dtype=F64) * torch.logspace(0.5, -0.5, dim)
    features = torch.randn(4000, dim, generator=g, dtype=F64) @ mixing.T + 3 * torch.randn(dim)
    normalizer = kind(dim)
    normalizer.update(features)
    normalizer.fit()
    torch.manual_seed(1)
    head = MLPHead(16, 20, dim).double()
    x = torch.randn(2, 5, 7, 16, generator=g, dtype=F64)
    before = head(x)

    folded = fold_normalizer(head, normalizer)

    torch.testing.assert_close(folded(x), normalizer.inverse(before), rtol=1e-12, atol=1e-12)
    assert torch.equal(head(x), before)  # the head itself is left as it was


def test_fold_refuses_a_normalizer_of_another_width() -> None:
    head = MLPHead(8, 8, 6)
    with pytest.raises(ValueError, match="feature width"):
        fold_normalizer(head, Identity(5))
