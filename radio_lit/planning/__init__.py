"""``radio-lit plan``'s estimates: a run built as ``radio-lit fit`` builds it, its steps counted
on fake tensors (FLOPs by part, memory peak), memory per rank, step time, images/s, GPU-hours
and the teacher cache's disk (:mod:`radio_lit.planning.plan`), from a device table and
calibrations measured on radio-lit's own runs (``devices.yaml``, ``calibration.yaml``)."""
