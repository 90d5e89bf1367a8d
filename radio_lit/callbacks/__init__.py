"""Training callbacks: teacher statistics estimation, trunk freezing, non-finite and
training-progress guards, throughput, preemption."""

from radio_lit.callbacks.freeze import FreezeBody
from radio_lit.callbacks.guard import NonFiniteGuard
from radio_lit.callbacks.preemption import Preemption
from radio_lit.callbacks.progress_guard import TrainingProgressGuard
from radio_lit.callbacks.random_states import RandomStates
from radio_lit.callbacks.skipped_data import SkippedData
from radio_lit.callbacks.statistics import TeacherStatsEstimation
from radio_lit.callbacks.throughput import ImagesPerSecond

__all__ = [
    "FreezeBody",
    "ImagesPerSecond",
    "NonFiniteGuard",
    "Preemption",
    "RandomStates",
    "SkippedData",
    "TeacherStatsEstimation",
    "TrainingProgressGuard",
]
