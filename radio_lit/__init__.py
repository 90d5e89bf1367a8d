"""radio-lit: agglomerative multi-teacher distillation (AM-RADIO, RADIOv2.5, PHI-S) on Lightning."""

from __future__ import annotations

import logging
from typing import Any

from radio_lit import _aliases
from radio_lit.hf import register_on_import

__all__ = ["DistillationModule", "load"]
__version__ = "0.1.0"

# Modules that moved keep their old import paths (configs' class_paths, checkpoints).
_aliases.install()

# transformers' AutoConfig / AutoModel load `radio-lit export --format hf` folders (lazily).
register_on_import()

# transformers imports torchao (the `fp8` extra) wherever it is installed; torchao registers
# enums with pytree that this torch supports natively, and torch logs one deprecation line per
# enum at import, on every radio-lit command. Nothing a user can act on: dropped.
logging.getLogger("torch.utils._pytree").addFilter(
    lambda record: "is an Enum subclass and is now natively supported" not in record.getMessage()
)


def __getattr__(name: str) -> Any:
    # Lazy, so that `import radio_lit.normalizers` does not import Lightning.
    if name == "load":
        from radio_lit.export import load

        return load
    if name == "DistillationModule":
        from radio_lit.module import DistillationModule

        return DistillationModule
    raise AttributeError(f"module 'radio_lit' has no attribute {name!r}")
