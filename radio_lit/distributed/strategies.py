"""Lightning's ``ModelParallelStrategy`` (FSDP2), resuming the checkpoints of runs with
parameters the optimizer has not updated yet, exactly.

An optimizer holds state only for the parameters it has updated: with
:class:`~radio_lit.callbacks.FreezeBody` (PHI-S A.7), none for the student's trunk during its
frozen steps. Lightning loads a checkpoint into the fresh optimizer's state dict
(``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``), which creates state
for *every* parameter first (one step with zero gradients and no learning rate):

- sharded (``save_distributed_checkpoint=True``): ``torch.distributed.checkpoint.load`` then
  asks the checkpoint for the trunk's ``step`` and moments, which it does not hold, and the
  resume fails (``Missing key in checkpoint state_dict: optimizer_0.state.student.<…>.step``);
- consolidated (one file): Lightning asks the file for every parameter of the model, the
  teachers' too, which checkpoints leave out (:meth:`radio_lit.teachers.Teacher.state_dict`),
  and fails (``KeyError: … 'teachers.<…>' that does not exist in the loaded checkpoint``);
  loaded without that check, the trunk would keep the created state.

:class:`ModelParallelStrategy` loads what the checkpoint holds and leaves the other
parameters without state, as they were when it was saved: the resumed run goes on as the
uninterrupted one (``tests/cluster/test_sharded.py``: bit for bit on one rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies.model_parallel import _load_checkpoint
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallel
from torch import nn
from torch.optim import Optimizer

from radio_lit.core.errors import ConfigError


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
    arguments; a checkpoint resumes into an optimizer that has state for some parameters only
    (module docstring; :func:`load_optimizer_shards`). ``[choice]`` a subclass, not a patch of
    Lightning: the model weights and the metadata load through Lightning's own
    ``_load_checkpoint``."""

    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> Any:
        path = Path(self.broadcast(checkpoint_path))
        assert self.lightning_module is not None
        if not path.is_dir():
            return self._load_consolidated(path, weights_only)
        metadata = _load_checkpoint(  # the model and meta.pt, as Lightning loads them
            path=path,
            state={"state_dict": self.model},
            strict=self.lightning_module.strict_loading,
            weights_only=weights_only,
        )
        for index, optimizer in enumerate(self.optimizers):
            load_optimizer_shards(self.model, optimizer, f"optimizer_{index}", path)
        return metadata

    def _load_consolidated(self, path: Path, weights_only: bool | None) -> Any:
        """Load a consolidated (single-file) checkpoint as Lightning does, but with the keys
        checked against ``state_dict()`` (Lightning checks every parameter, the teachers'
        too, which checkpoints leave out) and without state for the parameters the file's
        optimizer state has none for (Lightning's load leaves them the fresh optimizer's)."""
        saved = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        keys, expected = set(saved["state_dict"]), set(self.model.state_dict())
        if self.lightning_module.strict_loading and keys != expected:
            raise KeyError(
                f"{path}: the checkpoint's model state does not match the model: missing "
                f"{sorted(expected - keys)[:5]}, unexpected {sorted(keys - expected)[:5]}"
            )
        optimizers = {f"optimizer_{i}": o for i, o in enumerate(self.optimizers)}
        metadata = _load_checkpoint(
            path=path,
            state={"state_dict": self.model, **optimizers},
            strict=False,
            optimizer_states_from_list=True,
            weights_only=weights_only,
        )
        for optimizer, state in zip(self.optimizers, saved["optimizer_states"], strict=True):
            groups = zip(optimizer.param_groups, state["param_groups"], strict=True)
            for group, saved_group in groups:
                for param, key in zip(group["params"], saved_group["params"], strict=True):
                    if key not in state["state"]:
                        optimizer.state.pop(param, None)
        return metadata


def check_strategy(trainer: pl.Trainer) -> None:
    """Refuse, before a ``fit``, Lightning's own ``ModelParallelStrategy``: the checkpoints it
    writes would not resume (module docstring)."""
    strategy = trainer.strategy
    if isinstance(strategy, _LightningModelParallel) and not isinstance(
        strategy, ModelParallelStrategy
    ):
        raise ConfigError(
            "trainer.strategy: lightning.pytorch.strategies.ModelParallelStrategy cannot resume "
            "radio-lit's checkpoints (it asks them for the teachers' weights and for optimizer "
            "state of parameters not updated yet, e.g. FreezeBody's trunk); use "
            "radio_lit.distributed.strategies.ModelParallelStrategy (same init_args)"
        )
