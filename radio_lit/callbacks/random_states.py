"""RandomStates: every rank's random number generators in the checkpoint, restored on resume.

The step draws random numbers (the CPE position-embedding windows of the student, AM-RADIO
3.3, use the global torch RNG; dropout, drop-path); Lightning checkpoints do not hold RNG
states, so without this a resumed run draws differently from the uninterrupted one.
"""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from radio_lit.training.random_streams import gather_ranks, own_rank


def capture() -> dict[str, Any]:
    """This process's torch (CPU and CUDA), numpy and python RNG states, as plain values
    (tensors, ints, tuples) that ``torch.load(weights_only=True)`` reads back."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    """Set this process's RNGs to a :func:`capture` d state."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RandomStates(Callback):
    """Save every rank's RNG states in each checkpoint; restore them when a run resumes.

    The states are captured when the checkpoint is written (after a training step) and put
    back just before the first training step of the resumed run (after its data loader has
    started), so the resumed run draws what the uninterrupted run drew. Each rank gets its
    own states back; resuming on a different number of ranks cannot be exact and keeps the
    fresh states (with a warning).
    """

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": gather_ranks(capture())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = list(state_dict["ranks"])

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is None:
            return
        ranks, self._pending = self._pending, None
        state = own_rank(ranks, trainer.world_size, trainer.global_rank, "random states")
        if state is not None:
            restore(state)
