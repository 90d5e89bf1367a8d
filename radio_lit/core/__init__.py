"""The shared leaves every component may import: errors, the compile option, a teacher's output.

- :mod:`.errors`: radio-lit's user errors (one line, exit 2) and the command-line parser that
  prints them.
- :mod:`.compiling`: ``model.compile`` / a teacher's ``speed.compile`` (``torch.compile`` of
  the student and the teachers' encoders).
- :mod:`.outputs`: :class:`~radio_lit.core.outputs.TeacherOutput`, what teachers, the cache
  and exported models return.
- :mod:`.yaml_files`: a user's YAML file (a run's config, a calibration) read as a mapping,
  or one line naming the option, the file and the fault.

Nothing here imports another part of radio-lit.
"""
