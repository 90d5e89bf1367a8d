"""Old import paths of modules and names that moved when the package was regrouped, kept working.

Configs name classes by dotted path (``class_path: radio_lit.shifts.PatchShifts``), as do
training checkpoints' saved hyperparameters and users' own code. Each old module name below
imports the module that now holds the code: the same module object, so classes, functions
and ``isinstance`` checks are identical whichever name is used. Importing an old name warns
once (``DeprecationWarning``) with the new one. A name that moved out of a package that is
still there (``radio_lit.export.export_hf``, now in :mod:`radio_lit.hf.folder`, a layer above
``export``) is found by the package's ``__getattr__`` in :data:`MOVED_NAMES`
(:func:`moved_name`), with the same warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: old module -> the module that holds its code now
MOVED: dict[str, str] = {
    "radio_lit.errors": "radio_lit.core.errors",
    "radio_lit.compiling": "radio_lit.core.compiling",
    "radio_lit.strategies": "radio_lit.distributed.strategies",
    "radio_lit.cluster": "radio_lit.distributed.cluster",
    "radio_lit.grid": "radio_lit.geometry.grid",
    "radio_lit.shifts": "radio_lit.geometry.shifts",
    "radio_lit.student_step": "radio_lit.training.student_step",
    "radio_lit.per_teacher": "radio_lit.training.per_teacher",
    "radio_lit.optim": "radio_lit.training.optim",
    "radio_lit.partitions": "radio_lit.training.partitions",
    "radio_lit.random_streams": "radio_lit.training.random_streams",
    "radio_lit.cache.batch": "radio_lit.training.batch",
    "radio_lit.tokens": "radio_lit.evaluation.tokens",
    "radio_lit.command_list": "radio_lit.cli.commands",
    "radio_lit.class_parsers": "radio_lit.cli.class_parsers",
    "radio_lit.overlays": "radio_lit.cli.overlays",
    "radio_lit.runs": "radio_lit.cli.runs",
    "radio_lit.results": "radio_lit.cli.results",
    "radio_lit.hub": "radio_lit.cli.hub",
    "radio_lit.predict": "radio_lit.cli.predict",
    "radio_lit.evaluation.command": "radio_lit.cli.evaluate",
    "radio_lit.export.cli": "radio_lit.cli.export",
    "radio_lit.export.hf": "radio_lit.hf.folder",
}

#: old package -> {name -> the module that holds it now}: names that moved out of a package
#: that still exists (the Hugging Face folder writer of the README of 0.1's first release).
MOVED_NAMES: dict[str, dict[str, str]] = {
    "radio_lit.export": {
        "export_hf": "radio_lit.hf.folder",
        "save_hf": "radio_lit.hf.folder",
        "select_heads": "radio_lit.hf.folder",
    },
}


def moved_name(package: str, name: str) -> object:
    """``package.name`` where :data:`MOVED_NAMES` says it moved (one ``DeprecationWarning``
    naming the new path); ``AttributeError`` as Python words it for any other name (what a
    package's module-level ``__getattr__`` returns)."""
    new = MOVED_NAMES.get(package, {}).get(name)
    if new is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} moved to {new}.{name}; import it from there (the old name is an alias)",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(new), name)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the names of :data:`MOVED` and loads each as the module it moved to."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old name is an alias)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # the import system sets the alias's next
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own name, spec and loader
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
