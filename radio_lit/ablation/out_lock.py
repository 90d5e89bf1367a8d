"""One ``radio-lit ablate`` at a time in an ``--out`` folder.

Everything an ablation writes in ``OUT`` is named by row and seed alone (``rows/<row>.json``,
``logs/<row>.log``, ``tensorboard/<row>/``, a prerequisite's ``tensorboard/<name>[-seed<k>]/``
and its checkpoint), so that a second command in the same folder goes on where the first
stopped. Two commands running in it at once would write into the same run folders (both
training the FeatSharp upsampler of the ``High-res`` rows into one
``tensorboard/upsampler/``, say). [choice] A lock refuses the second rather than giving
each its own names: what a finished row wrote is what the next command reuses.

The lock is ``OUT/.ablate.lock`` under ``fcntl.flock``: the kernel releases it when its
process ends however it ends (a killed ablation never blocks the next one); the file holds
the holder's process id, for the message.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The lock file, in ``--out``.
LOCK_NAME = ".ablate.lock"


@contextmanager
def holding(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock while the block runs.

    Raises:
        ValueError: one line naming the folder and the process that holds it.
    """
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_NAME, "a+", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise ValueError(
                f"--out {out}: another radio-lit ablate (process {holder}) is running in this "
                "folder; wait for it to end (then the same command goes on where it stopped) or "
                "give another --out"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
