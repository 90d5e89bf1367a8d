"""The export commands' progress bar: one step per stage, cleared when an error ends it, so that
the error's one line (``radio-lit: error: ...``) stands alone instead of under a half-done bar."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

__all__ = ["stages"]


@contextmanager
def stages(total: int, desc: str = "export") -> Iterator[tqdm]:
    """A ``tqdm`` bar of ``total`` steps; kept on screen when the block ends normally, erased
    when it raises."""
    with tqdm(total=total, unit="step", desc=desc, dynamic_ncols=True) as bar:
        try:
            yield bar
        except BaseException:
            bar.leave = False  # tqdm erases its line when it closes
            raise
