"""Lightning's ``ModelParallelStrategy`` (FSDP2), resuming the sharded checkpoints of runs with
parameters the optimizer has not updated yet.

An optimizer holds state only for the parameters it has updated: with
:class:`~radio_lit.callbacks.FreezeBody` (PHI-S A.7), none for the student's trunk during its
frozen steps. Lightning loads a sharded checkpoint (``save_distributed_checkpoint=True``) into
the state dict ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` gives for
the fresh optimizer, which creates state for *every* parameter first (one step with zero
gradients); ``torch.distributed.checkpoint.load`` then asks the checkpoint for the trunk's
``step`` and moments, which it does not hold, and the resume fails with
``Missing key in checkpoint state_dict: optimizer_0.state.student.<…>.step``. A consolidated
(single-file) checkpoint resumes: ``set_optimizer_state_dict`` takes its full state as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.fabric.strategies.model_parallel import _load_checkpoint
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallel
from torch import nn
from torch.optim import Optimizer


def load_optimizer_shards(model: nn.Module, optimizer: Optimizer, key: str, path: Path) -> None:
    """Load ``optimizer``'s state from the sharded checkpoint at ``path`` (saved under ``key``,
    ``optimizer_<index>``): the state of the parameters it holds state for, no other.

    The state dict requested is the fresh optimizer's (``get_optimizer_state_dict``: as
    Lightning's load, it first steps once with zero gradients and no learning rate, which
    changes no weight), less the parameters the checkpoint holds no state for (its
    ``.metadata``: ``<key>.state.<parameter FQN>.<step | exp_avg | …>``); these are left
    without state (``set_optimizer_state_dict(strict=False)``), as they were when it was saved.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    prefix = f"{key}.state."
    held = {k.removeprefix(prefix).rsplit(".", 1)[0] for k in saved if k.startswith(prefix)}
    state = get_optimizer_state_dict(model, optimizer)
    requested = {key: {**state, "state": {n: s for n, s in state["state"].items() if n in held}}}
    dcp.load(requested, checkpoint_id=path)
    options = StateDictOptions(cpu_offload=True, strict=False)
    set_optimizer_state_dict(model, optimizer, requested[key], options=options)


class ModelParallelStrategy(_LightningModelParallel):
    """Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy`, same
    arguments; a sharded checkpoint resumes into an optimizer that has state for some
    parameters only (module docstring; :func:`load_optimizer_shards`). ``[choice]`` a
    subclass, not a patch of Lightning: the model, the metadata and consolidated files load
    as Lightning loads them."""

    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> Any:
        path = Path(self.broadcast(checkpoint_path))
        if not path.is_dir():  # a consolidated file: Lightning's load takes it as it is
            return super().load_checkpoint(path, weights_only)
        assert self.lightning_module is not None
        metadata = _load_checkpoint(  # the model and meta.pt, as Lightning loads them
            path=path,
            state={"state_dict": self.model},
            strict=self.lightning_module.strict_loading,
            weights_only=weights_only,
        )
        for index, optimizer in enumerate(self.optimizers):
            load_optimizer_shards(self.model, optimizer, f"optimizer_{index}", path)
        return metadata
