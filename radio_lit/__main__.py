"""The ``radio-lit`` console script (and ``python -m radio_lit``): :func:`radio_lit.cli.app.main`,
with the stop signals of ``radio-lit fit`` taken before anything heavy is imported.

Importing torch, Lightning and the model code takes seconds, and a teacher of billions of
parameters takes minutes to build; a Ctrl-C, a ``SIGTERM`` or SLURM's ``USR1`` in that time
must stop the run in one line (and requeue a SLURM job), not print a traceback or kill the job
(:class:`radio_lit.distributed.cluster.StopSignals`). So this module imports only the standard
library
and :mod:`radio_lit.distributed.cluster` before it takes the signals.
"""

from __future__ import annotations

import sys

from radio_lit.core.errors import BuildInterrupted, interruption
from radio_lit.distributed.cluster import STOP, stop_building


def main() -> None:
    """Take the stop signals for ``radio-lit fit``, then run the command."""
    if sys.argv[1:2] == ["fit"]:
        STOP.install(raising=True)
    try:
        from radio_lit.cli.app import main as run

        run()
    except (BuildInterrupted, Exception) as error:  # before radio_lit.cli.app.main took it
        stop = interruption(error)  # raised, or wrapped when it landed while a class was made
        if stop is None:
            raise
        sys.exit(stop_building(stop.signum))


if __name__ == "__main__":
    main()
