"""Frozen teachers (AM-RADIO section 3.4): generic timm and transformers ViTs, and presets per
family: open_clip CLIP / SigLIP / SigLIP2, DINOv2 / DINOv3, SAM / SAM2 / SAM3, RADIO.

:class:`RescaledTeacher` gives a (tiny) teacher the activation statistics of a real one
(PHI-S table 7), for small-scale ablations; :class:`FixedPatternTeacher` adds a fixed pattern
locked to a teacher's token grid (C-RADIOv4 report 2.3), for the shift-equivariance ablations.
"""

from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.dinov2 import DINOv2Teacher
from radio_lit.teachers.dinov3 import DINOv3Teacher
from radio_lit.teachers.fixed_pattern import FixedPatternTeacher
from radio_lit.teachers.open_clip import OpenCLIPTeacher
from radio_lit.teachers.radio import RADIOTeacher
from radio_lit.teachers.rescaled import TABLE7, FeatureStatistics, RescaledTeacher
from radio_lit.teachers.sam import SAMTeacher
from radio_lit.teachers.sam_hf import SAM2Teacher, SAM3Teacher
from radio_lit.teachers.timm_teacher import TimmTeacher
from radio_lit.teachers.transformers_teacher import TransformersTeacher

__all__ = [
    "TABLE7",
    "DINOv2Teacher",
    "DINOv3Teacher",
    "FeatureStatistics",
    "FixedPatternTeacher",
    "RADIOTeacher",
    "OpenCLIPTeacher",
    "RescaledTeacher",
    "SAM2Teacher",
    "SAM3Teacher",
    "SAMTeacher",
    "Teacher",
    "TeacherOutput",
    "TimmTeacher",
    "TransformersTeacher",
]
