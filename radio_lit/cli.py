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

from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningCLI

from radio_lit.module import DistillationModule


class RadioLitCLI(LightningCLI):
    """LightningCLI with fit / validate / test / predict for one distillation stage."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        super().__init__(
            DistillationModule,
            LightningDataModule,
            subclass_mode_data=True,
            **kwargs,  # type: ignore[arg-type]
        )


#: ``radio-lit <name> …`` commands beside LightningCLI's fit / validate / test / predict:
#: name -> ``"module:function"``; the function takes the arguments after the name.
SUBCOMMANDS: dict[str, str] = {
    "evaluate": "radio_lit.evaluation.command:evaluate",
}


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``radio-lit`` console script."""
    # Lightning 2.6 calls a torch.utils._pytree API that newer torch releases deprecate.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        module, function = SUBCOMMANDS[args[0]].split(":")
        getattr(importlib.import_module(module), function)(args[1:])
        return
    RadioLitCLI(args=args)


if __name__ == "__main__":
    main()
