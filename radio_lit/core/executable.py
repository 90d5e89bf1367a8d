"""The ``radio-lit`` command as the user typed it, for the commands radio-lit prints.

A printed ``resume with: radio-lit fit …`` or ``train from it with: radio-lit fit …`` is meant
to be pasted back into the shell; a user who ran ``.venv/bin/radio-lit`` (the README's
installation, the command not on ``PATH``) needs ``.venv/bin/radio-lit`` there.
"""

from __future__ import annotations

import os
import sys

#: The console script's name.
NAME = "radio-lit"


def executable() -> str:
    """``sys.argv[0]`` as typed when it is the ``radio-lit`` console script
    (``.venv/bin/radio-lit``, ``radio-lit``), else ``radio-lit`` (``python -m radio_lit``, a
    Python session, a test)."""
    typed = sys.argv[0] if sys.argv else ""
    return typed if os.path.basename(typed) == NAME else NAME
