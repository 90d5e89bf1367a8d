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
from lightning.pytorch.utilities import rank_zero_warn

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
    """Set this process's RNGs to a :func:`capture` d state (those it holds)."""
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _equal(a: Any, b: Any) -> bool:
    """Whether two :func:`capture` d states (nested tuples, dicts, tensors) are equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


class RandomStates(Callback):
    """Save every rank's RNG states in each checkpoint; restore them when a run resumes.

    The states are captured when the checkpoint is written (after a training step) and put
    back just before the first training step of the resumed run (after its data loader has
    started), so the resumed run draws what the uninterrupted run drew. Each rank gets its
    own states back. On a different number of ranks, a generator whose state every saved rank
    held alike (torch's under the balanced partition layout, radio_lit.training.partitions:
    every rank draws the partitions' resolutions alike) is every new rank's too, so it comes
    back; the others cannot be exact and keep their fresh states (with a warning).
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
        alike = {k: v for k, v in ranks[0].items() if all(_equal(r.get(k), v) for r in ranks)}
        if len(ranks) != trainer.world_size and alike:
            restore(alike)  # generators every rank drew alike
            fresh = sorted(set(ranks[0]) - set(alike))
            if fresh:
                rank_zero_warn(
                    f"the checkpoint's {len(ranks)} rank(s) held different {', '.join(fresh)} "
                    f"random states and this run has {trainer.world_size}: those stay fresh "
                    f"(restored: {', '.join(alike)})"
                )
            return
        state = own_rank(ranks, trainer.world_size, trainer.global_rank, "random states")
        if state is not None:
            restore(state)
