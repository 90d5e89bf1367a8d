"""``model.compile``: ``torch.compile`` of the student and of each teacher.

Each model is compiled in place (``nn.Module.compile``), so parameter names, state dicts and
checkpoints stay those of the eager model. Under FSDP2 it runs after ``fully_shard`` (the order
torch's FSDP2 documents). The student compiles without graph breaks, σReparam included
(:func:`radio_lit.students.spectral_reparam.spectral_step` computes its weights inside the
compiled forward); a teacher whose library code breaks the graph still runs, in several graphs.

Every model compiled in place shares one code object (``nn.Module``'s call), and dynamo keeps
its compiled versions, and counts its recompilations against ``recompile_limit``, per code
object: the student and the teachers would share one budget (8 by default; a student and three
teachers at two shapes each use it up, and what comes next runs eagerly, with a warning), so
the limit is raised to the default budget per compiled model. [choice]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

CompileOption = bool | dict[str, Any]
"""``False`` (eager), ``True`` (``torch.compile``'s defaults: inductor) or the keyword arguments
of ``torch.compile`` (``{"mode": "reduce-overhead"}``, ``{"backend": "aot_eager"}``...)."""


#: Recompilations each compiled model may use: dynamo's default ``recompile_limit``.
PER_MODEL_RECOMPILES: int = torch._dynamo.config.recompile_limit


def compile_models(models: Iterable[nn.Module], option: CompileOption) -> None:
    """``nn.Module.compile`` every model of ``models`` with ``option``'s arguments, in place,
    with :data:`PER_MODEL_RECOMPILES` each (the module docstring says why)."""
    if option is False:
        return
    models = list(models)
    kwargs = {} if option is True else dict(option)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, PER_MODEL_RECOMPILES * len(models))
    for model in models:
        model.compile(**kwargs)
