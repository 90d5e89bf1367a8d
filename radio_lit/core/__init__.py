"""The shared leaves every component may import: errors, the compile option, a teacher's output.

- :mod:`.errors`: radio-lit's user errors (one line, exit 2) and the command-line parser that
  prints them.
- :mod:`.compiling`: ``model.compile`` / a teacher's ``speed.compile`` (``torch.compile`` of
  the student and the teachers' encoders).
- :mod:`.outputs`: :class:`~radio_lit.core.outputs.TeacherOutput`, what teachers, the cache
  and exported models return.

Nothing here imports another part of radio-lit.
"""
