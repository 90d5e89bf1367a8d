"""``model.compile``: ``torch.compile`` of the student and of each teacher.

Each model is compiled in place (``nn.Module.compile``), so parameter names, state dicts and
checkpoints stay those of the eager model. Under FSDP2 it runs after ``fully_shard`` (the order
torch's FSDP2 documents). The student compiles without graph breaks, σReparam included
(:func:`radio_lit.students.spectral_reparam.spectral_step` computes its weights inside the
compiled forward); a teacher whose library code breaks the graph still runs, in several graphs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

CompileOption = bool | dict[str, Any]
"""``False`` (eager), ``True`` (``torch.compile``'s defaults: inductor) or the keyword arguments
of ``torch.compile`` (``{"mode": "reduce-overhead"}``, ``{"backend": "aot_eager"}``...)."""


def compile_models(models: Iterable[nn.Module], option: CompileOption) -> None:
    """``nn.Module.compile`` every model of ``models`` with ``option``'s arguments, in place."""
    if option is False:
        return
    kwargs = {} if option is True else dict(option)
    for model in models:
        model.compile(**kwargs)
