"""Teacher-feature cache: pay for the teachers once, replay the exact views.

``radio-lit cache --config RUN.yaml --out DIR`` (:mod:`radio_lit.cache.writer`) runs a run's
teachers over its training data, several views per image drawn exactly as training draws
them, and stores each view's crop and teacher outputs (:mod:`.shards`, :mod:`.manifest`).
``data: radio_lit.cache.CachedViews`` (:mod:`.datamodule`) trains from it: the step takes the
teacher outputs from the batch (:class:`.CachedBatch`) instead of running the teachers, and
everything after them is unchanged; the teachers are not built (:class:`.CachedTeacher`).
"""

from radio_lit.cache.datamodule import CachedDataset, CachedViews, ViewSampler
from radio_lit.cache.manifest import Manifest, check_run, teacher_signature, view_sizes
from radio_lit.cache.teacher import CachedTeacher
from radio_lit.training.batch import CachedBatch, collate_views, output_key, student_pixels

__all__ = [
    "CachedBatch",
    "CachedDataset",
    "CachedTeacher",
    "CachedViews",
    "Manifest",
    "ViewSampler",
    "check_run",
    "collate_views",
    "output_key",
    "student_pixels",
    "teacher_signature",
    "view_sizes",
]
