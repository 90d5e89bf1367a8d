"""What a step logs, and when training metrics are logged (the logging throttle)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor


def logs_this_step(trainer: Any) -> bool:
    """Whether to log this training step's metrics: the steps the logger writes
    (``log_every_n_steps``), plus the first and the last step of the run.

    Every ``LightningModule.log`` call costs host time (about 0.8 ms on a 2-core CPU: Lightning
    walks and deep-copies its result bookkeeping on each call, Lightning #20388) whether or
    not the logger writes the step, so training metrics are not logged on the other steps
    (``trainer.callback_metrics`` and the progress bar then hold the last logged values).
    ``trainer`` ``None`` (a module outside a Trainer) logs every step.
    """
    if trainer is None:
        return True
    step, every = trainer.global_step, trainer.log_every_n_steps
    return step == 0 or step + 1 == trainer.max_steps or (every > 0 and (step + 1) % every == 0)


def step_logs(
    stage: str, losses: Mapping[str, Tensor], weights: Mapping[str, Tensor] | None
) -> dict[str, Tensor]:
    """A step's logged values besides the loss: ``<stage>/<key>`` for every loss term (mean
    over images) and, in training, each term's effective balancer weight
    ``train/balancer/<teacher>/<term>``."""
    logged = {f"{stage}/{k}": v.detach().mean() for k, v in losses.items()}
    logged.update({f"{stage}/balancer/{k}": w for k, w in (weights or {}).items()})
    return logged
