"""The parts of one training step, in the order a batch meets them (DESIGN.md).

:class:`~radio_lit.module.DistillationModule` orchestrates; each part is a module of functions
or small classes it calls:

- :mod:`.batch`: a batch of cached views (:class:`~radio_lit.training.batch.CachedBatch`) in
  place of live teachers;
- :mod:`.partitions`: which rank runs which teachers at which batch size and resolution;
- :mod:`.student_step`: the student's side: shifted views, DAMP-noised forward, MESA, EMA;
- :mod:`.step`: teachers, loss grids, matching, normalized targets, loss terms, the balancer;
- :mod:`.per_teacher`: per-teacher normalizer and loss options;
- :mod:`.optim`: parameter groups, weight decay, learning-rate schedules, the fastest
  implementation of each optimizer;
- :mod:`.lamb`: LAMB with its update compiled;
- :mod:`.random_streams`: per-rank random streams that resume exactly.
"""
