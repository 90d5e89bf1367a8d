"""transformers' Auto classes for radio-lit models, registered without importing transformers.

``AutoConfig`` / ``AutoModel.from_pretrained(folder)`` load a folder written by
``radio-lit export --format hf`` (``model_type: "radio_lit"``) with radio-lit installed and
imported: :func:`register_on_import` (called by ``import radio_lit``) registers
:class:`~radio_lit.hf.configuration.RadioLitConfig` with ``AutoConfig``, and the first
``RadioLitConfig`` built (``AutoModel.from_pretrained`` builds one before it looks up the
model class) registers :class:`~radio_lit.hf.modeling.RadioLitHFModel` with ``AutoModel``; no
remote code runs.

[choice] Importing transformers' Auto classes costs about 1.5 s, so ``import radio_lit`` does
not import them. The config is registered right after transformers' own
``transformers.models.auto.configuration_auto`` finishes executing (a ``sys.meta_path`` hook;
at once when it is already imported). The model class, whose module imports
``transformers.modeling_utils`` and radio-lit's model, is registered only when a config is
built, from the user's call and never in the middle of another package's imports (where
importing them can meet a partially initialized module, e.g. Lightning importing torchmetrics
importing transformers). A registration that fails never breaks the import it follows (it
warns).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

_CONFIG_MODULE = "transformers.models.auto.configuration_auto"
_registered = {"config": False, "model": False}


def register_config() -> None:
    """``AutoConfig.register("radio_lit", RadioLitConfig)``; the model class follows when a
    config is built (idempotent)."""
    if _registered["config"]:
        return
    from transformers import AutoConfig

    from radio_lit.hf import configuration

    AutoConfig.register(configuration.MODEL_TYPE, configuration.RadioLitConfig, exist_ok=True)
    configuration.ON_CREATE.append(register_model)
    _registered["config"] = True


def register_model() -> None:
    """``AutoModel.register(RadioLitConfig, RadioLitHFModel)`` (idempotent)."""
    if _registered["model"]:
        return
    from transformers import AutoModel

    from radio_lit.hf.configuration import RadioLitConfig
    from radio_lit.hf.modeling import RadioLitHFModel

    AutoModel.register(RadioLitConfig, RadioLitHFModel, exist_ok=True)
    _registered["model"] = True


class _ThenRegister(importlib.abc.Loader):
    """``configuration_auto``'s own loader, followed by :func:`register_config`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            register_config()
        except Exception as error:  # never break transformers' import
            warnings.warn(
                f"radio-lit could not register its config with transformers' AutoConfig "
                f"({error}); load exported folders with radio_lit.load",
                stacklevel=2,
            )

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ... of the real loader
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``configuration_auto`` with the other finders and wraps its loader."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _CONFIG_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenRegister(spec.loader)
                return spec
        return None


def register_on_import() -> None:
    """Register the config now if transformers' Auto classes are imported, else once they are."""
    if _CONFIG_MODULE in sys.modules:
        register_config()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
