"""How a run spreads over processes and survives its cluster.

- :mod:`.strategies`: the FSDP2 strategy (Lightning's ``ModelParallelStrategy``) that resumes
  what it saved, and the strategy checks made when a run is built.
- :mod:`.cluster`: SLURM (allocations, requeue), the stop signals and what a rank does on them.

The sharding of the student itself lives with the student (:mod:`radio_lit.students.sharding`).
"""
