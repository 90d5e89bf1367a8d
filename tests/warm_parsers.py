"""Imported by the tests' fork server (:data:`tests.forking.PRELOAD`): parses the quickstart's
``radio-lit fit`` command line once, so that every process forked from the server starts with
jsonargparse's class parsers built (:mod:`radio_lit.cli.class_parsers`; ~0.7 CPU-s of each forked
command). Parsing only: nothing is built, no thread is started (the Hub probe is not), the
seed is not set; what a command parses with these parsers is what it parses with fresh ones
(``tests/cli/test_class_parsers.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from radio_lit.cli.app import RadioLitCLI
from radio_lit.cli.hub import HubProbe

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


class _ParseOnly(RadioLitCLI):
    """``radio-lit fit``'s parser and parse, nothing built or run."""

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def _parse(config: Path) -> Any:
    with tempfile.TemporaryDirectory() as root, mock.patch.object(HubProbe, "start", lambda p: p):
        args = ["fit", "--config", str(config), "--seed_everything=false"]
        args += [
            f"--trainer.default_root_dir={root}",
            f"--trainer.logger.init_args.save_dir={root}",
        ]
        return _ParseOnly(args=args)


_parse(QUICKSTART)
