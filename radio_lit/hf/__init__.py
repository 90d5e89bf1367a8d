"""transformers' Auto classes for radio-lit models, registered without importing transformers.

``AutoConfig`` / ``AutoModel.from_pretrained(folder)`` load a folder written by
``radio-lit export --format hf`` (``model_type: "radio_lit"``) with radio-lit installed and
imported: :func:`register_on_import` (called by ``import radio_lit``) registers
:class:`~radio_lit.hf.configuration.RadioLitConfig` with ``AutoConfig`` and
:class:`~radio_lit.hf.modeling.RadioLitHFModel` with ``AutoModel``; no remote code runs.

[choice] Importing transformers' Auto classes costs about 1.5 s, so ``import radio_lit`` does
not import them: each registration runs right after transformers' own module defining the
Auto class finishes executing (a ``sys.meta_path`` hook on
``transformers.models.auto.configuration_auto`` and ``...modeling_auto``), or at once when it
is already imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_CONFIG_MODULE = "transformers.models.auto.configuration_auto"
_MODEL_MODULE = "transformers.models.auto.modeling_auto"


def register_config() -> None:
    """``AutoConfig.register("radio_lit", RadioLitConfig)`` (idempotent)."""
    from transformers import AutoConfig

    from radio_lit.hf.configuration import MODEL_TYPE, RadioLitConfig

    AutoConfig.register(MODEL_TYPE, RadioLitConfig, exist_ok=True)


def register_model() -> None:
    """``AutoModel.register(RadioLitConfig, RadioLitHFModel)`` (idempotent)."""
    from transformers import AutoModel

    from radio_lit.hf.configuration import RadioLitConfig
    from radio_lit.hf.modeling import RadioLitHFModel

    AutoModel.register(RadioLitConfig, RadioLitHFModel, exist_ok=True)


_ACTIONS: dict[str, Callable[[], None]] = {
    _CONFIG_MODULE: register_config,
    _MODEL_MODULE: register_model,
}


class _ThenRegister(importlib.abc.Loader):
    """A module's own loader, followed by a registration once the module has executed."""

    def __init__(self, loader: Any, action: Callable[[], None]) -> None:
        self.loader = loader
        self.action = action

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.action()

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ... of the real loader
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the Auto-class modules with the other finders and wraps their loaders."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        action = _ACTIONS.get(name)
        if action is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenRegister(spec.loader, action)
                return spec
        return None


def register_on_import() -> None:
    """Register now what transformers already imported, and the rest when it is imported."""
    pending = False
    for module, action in _ACTIONS.items():
        if module in sys.modules:
            action()
        else:
            pending = True
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
