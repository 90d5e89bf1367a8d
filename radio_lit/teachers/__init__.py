"""Frozen teachers (AM-RADIO section 3.4): open_clip CLIPs, DINOv2 (timm / transformers), SAM.

:class:`RescaledTeacher` gives a (tiny) teacher the activation statistics of a real one
(PHI-S table 7), for small-scale ablations.
"""

from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.dinov2 import DINOv2Teacher
from radio_lit.teachers.open_clip import OpenCLIPTeacher
from radio_lit.teachers.rescaled import TABLE7, FeatureStatistics, RescaledTeacher
from radio_lit.teachers.sam import SAMTeacher

__all__ = [
    "TABLE7",
    "DINOv2Teacher",
    "FeatureStatistics",
    "OpenCLIPTeacher",
    "RescaledTeacher",
    "SAMTeacher",
    "Teacher",
    "TeacherOutput",
]
