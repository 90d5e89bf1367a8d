"""Student backbones (CPE ViT, E-RADIO), their per-teacher adaptor heads, σReparam and FSDP2
sharding."""

from radio_lit.students.base import Student, StudentOutput
from radio_lit.students.cpe_vit import CPEViT
from radio_lit.students.eradio import ERadio
from radio_lit.students.heads import MLPHead, TeacherHeads
from radio_lit.students.sharding import FSDP2, shard_student
from radio_lit.students.spectral_reparam import (
    SpectralLinear,
    enable_spectral_reparam,
    fold_spectral_reparam,
)

__all__ = [
    "Student",
    "CPEViT",
    "ERadio",
    "StudentOutput",
    "MLPHead",
    "TeacherHeads",
    "SpectralLinear",
    "enable_spectral_reparam",
    "fold_spectral_reparam",
    "FSDP2",
    "shard_student",
]
