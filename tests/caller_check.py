"""jsonargparse's caller check without ``inspect.stack()``'s source lookups, for the tests.

``ArgumentParser.parse_known_args`` (jsonargparse 4) accepts only callers inside jsonargparse
or argcomplete, found by ``inspect.getmodule(inspect.stack()[1][0])``. ``inspect.stack()`` looks
up every frame's source line, and for a frame without a file (``<frozen runpy>``, execnet's
``<string>``) scans all of ``sys.modules`` (~4300 in a test process): ~50 ms at the ~60 frames
of a test, ~0.1 CPU-s per ``radio-lit`` command a test runs in-process (one or two parses
each), against a few ms at a console script's shallow stack. The check itself is unchanged:
only the frames it indexes are listed without their source.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any


class _FramesOnly(types.ModuleType):
    """``inspect`` with a ``stack()`` of ``(frame,)`` rows, innermost first, as
    ``inspect.stack()[i][0]`` indexes them; everything else is ``inspect``'s own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[tuple[types.FrameType]]:
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            frames.append((frame,))
            frame = frame.f_back
        return frames


def frames_only_caller_check() -> None:
    """Give ``jsonargparse._core`` (whose only ``inspect.stack()`` is the caller check) the
    frames-only ``inspect``."""
    import jsonargparse._core as core

    if getattr(core, "inspect", None) is inspect:
        core.inspect = _FramesOnly("inspect")
