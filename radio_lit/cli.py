"""The ``radio-lit`` command: a LightningCLI over :class:`~radio_lit.module.DistillationModule`.

``radio-lit fit --config configs/stage1.yaml`` trains; ``--print_config`` prints the resolved
configuration; ``--model.normalizer radio_lit.normalizers.PhiS`` swaps every teacher's
normalizer. Teachers, datamodules, losses, normalizers and the optimizer are all given as
``class_path`` / ``init_args`` and validated against their typed constructors.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence

from jsonargparse import ArgumentError
from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningCLI

from radio_lit.errors import ConfigError, RadioLitError, config_error, report, short_message
from radio_lit.module import DistillationModule


class RadioLitCLI(LightningCLI):
    """LightningCLI with fit / validate / test / predict for one distillation stage."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        # Bad arguments raise (radio_lit.cli.main prints them) instead of printing the usage.
        kwargs.setdefault("parser_kwargs", {"exit_on_error": False})
        super().__init__(
            DistillationModule,
            LightningDataModule,
            subclass_mode_data=True,
            **kwargs,  # type: ignore[arg-type]
        )

    def instantiate_classes(self) -> None:
        """Build the configured classes; a constructor's error becomes a :class:`ConfigError`
        prefixed with the config key of the class that raised it."""
        try:
            super().instantiate_classes()
        except Exception as error:  # any constructor error is a configuration problem
            section = (
                self.config.get(str(self.subcommand), self.config)
                if self.subcommand
                else self.config
            )
            raise config_error(error, section.clone().as_dict()) from error


#: ``radio-lit <name> …`` commands beside LightningCLI's fit / validate / test / predict:
#: name -> ``"module:function"``; the function takes the arguments after the name.
SUBCOMMANDS: dict[str, str] = {
    "ablate": "radio_lit.ablation.runner:main",
    "evaluate": "radio_lit.evaluation.command:evaluate",
    "cache": "radio_lit.cache.writer:main",
    "export": "radio_lit.export.cli:main",
}


#: Errors of a subcommand (beside :class:`RadioLitError`) that are the user's input, not a bug.
_SUBCOMMAND_USER_ERRORS = (ArgumentError, ValueError, LookupError, OSError, ImportError)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``radio-lit`` console script.

    User errors (bad arguments or config values, missing files, unknown model names) print
    one message and exit with status 2; a run stopped by a training fault exits with 1;
    ``RADIO_LIT_TRACEBACK=1`` adds the traceback (radio_lit.errors).
    """
    # Lightning 2.6 calls a torch.utils._pytree API that newer torch releases deprecate.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in SUBCOMMANDS:
            module, function = SUBCOMMANDS[args[0]].split(":")
            try:
                getattr(importlib.import_module(module), function)(args[1:])
            except _SUBCOMMAND_USER_ERRORS as error:
                raise ConfigError(short_message(error)) from error
            return
        try:
            RadioLitCLI(args=args if argv is not None else None)
        except ArgumentError as error:
            raise ConfigError(short_message(error)) from error
    except RadioLitError as error:
        sys.exit(report(error, error.exit_code))


if __name__ == "__main__":
    main()
