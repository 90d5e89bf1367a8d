"""Losses between student predictions and (normalized) teacher targets, and the balancers that
combine the per-teacher terms into one loss."""

from radio_lit.losses.angular import AngleBalanced, AngularDispersion, angle
from radio_lit.losses.balancers import (
    AdaLoss,
    Balancer,
    BalancerFactory,
    TeacherDropping,
    Uncertainty,
    Weighted,
)
from radio_lit.losses.feature import MSE, Cosine, HybridMSE, HybridSmoothL1, Loss

__all__ = [
    "MSE",
    "AdaLoss",
    "AngleBalanced",
    "AngularDispersion",
    "Balancer",
    "BalancerFactory",
    "Cosine",
    "HybridMSE",
    "HybridSmoothL1",
    "Loss",
    "TeacherDropping",
    "Uncertainty",
    "Weighted",
    "angle",
]
