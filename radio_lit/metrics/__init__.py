"""Validation and test metrics: teacher-space MSE, fidelity, error-variance ranges, summary
cosine (PHI-S section 4 and appendix A.9.4; RADIOv2.5 section 4.4); the share of a teacher's
fixed-pattern noise the student reproduces (C-RADIOv4 report 2.3)."""

from radio_lit.metrics.distillation import DistillationMetrics, TeacherMetrics
from radio_lit.metrics.features import ErrorVarianceRange, Fidelity, GlobalFidelity, SummaryCosine
from radio_lit.metrics.fixed_pattern import PatternShare

__all__ = [
    "DistillationMetrics",
    "ErrorVarianceRange",
    "Fidelity",
    "GlobalFidelity",
    "PatternShare",
    "SummaryCosine",
    "TeacherMetrics",
]
