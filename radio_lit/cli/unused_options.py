"""LightningCLI's ``--optimizer`` and ``--lr_scheduler``, which radio-lit does not use.

LightningCLI adds both to every command and, given ``--optimizer``, replaces the module's
``configure_optimizers`` with one optimizer over ``model.parameters()``; given only
``--lr_scheduler``, it drops it. Either way the run would lose what the module's own
``configure_optimizers`` builds: the named parameter groups and their weight-decay rule
(:func:`radio_lit.training.optim.parameter_groups`, PHI-S A.7), the fastest implementation, and
the per-step linear warm-up and cosine annealing of the papers
(:func:`radio_lit.training.optim.warmup_cosine`; RADIOv2.5, PHI-S). [choice] The two options
are therefore off (``auto_configure_optimizers=False``): the optimizer is ``model.optimizer``
(a class built on the module's groups), the schedule ``model.warmup_steps`` and
``model.min_lr_ratio`` (``FeatSharpModule`` also ``model.warmup_start``), and a line giving
``--optimizer`` or ``--lr_scheduler`` is refused in one line naming them. The two keys stay
in the parser, hidden from the help, only so that a run's ``config.yaml`` written before
(``optimizer: null``, ``lr_scheduler: null``) still loads; any other value is refused.
"""

from __future__ import annotations

from argparse import SUPPRESS
from collections.abc import Sequence
from typing import Any

from radio_lit.core.errors import ConfigError

#: LightningCLI's keys that radio-lit does not use.
UNUSED = ("optimizer", "lr_scheduler")

#: What each of them stands for in radio-lit.
_INSTEAD = {
    "optimizer": "the optimizer is --model.optimizer CLASS (e.g. --model.optimizer "
    "torch.optim.SGD --model.optimizer.lr 0.1), built on the module's parameter groups",
    "lr_scheduler": "the schedule is the module's own per-step linear warm-up then cosine "
    "annealing: set --model.warmup_steps N and --model.min_lr_ratio R (the optimizer's "
    "--model.optimizer.lr is its peak)",
}


def add_null_keys(parser: Any) -> None:
    """Hidden ``--optimizer`` / ``--lr_scheduler`` that accept only ``null`` (old
    ``config.yaml`` files hold them)."""
    for key in UNUSED:
        action = parser.add_argument(f"--{key}", type=Any, default=None, help=SUPPRESS)
        action.unused_option = True  # not a class's own ``optimizer`` (FeatSharpModule's)


def is_unused(action: Any) -> bool:
    """Whether ``action`` is one of the hidden keys :func:`add_null_keys` added."""
    return getattr(action, "unused_option", False)


def refusal(key: str) -> ConfigError:
    """The one line for a run that gives ``key``."""
    return ConfigError(f"{key}: radio-lit does not use LightningCLI's --{key}: {_INSTEAD[key]}")


def refuse_given(argv: Sequence[str]) -> None:
    """Raise :func:`refusal` when the command line gives one of :data:`UNUSED`
    (``--lr_scheduler X``, ``--lr_scheduler.start_factor 0``, ``--optimizer=…``)."""
    for arg in argv:
        name = arg.split("=", 1)[0].removeprefix("--").split(".", 1)[0]
        if arg.startswith("--") and name in UNUSED:
            raise refusal(name)
