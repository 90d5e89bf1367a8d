"""What a step and an epoch log, and when training metrics are logged (the logging throttle).

Only the LightningModule logs; these functions return the ``{tag: value}`` dicts it logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from radio_lit.losses import Balancer
from radio_lit.metrics.distillation import DistillationMetrics
from radio_lit.training.partitions import Chunk


def logs_this_step(trainer: Any, step: int | None = None) -> bool:
    """Whether to log training step ``step``'s metrics (default: the step running,
    ``trainer.global_step``): the steps the logger writes (``log_every_n_steps``), plus the
    first and the last step of the run.

    Every ``LightningModule.log`` call costs host time (about 0.8 ms on a 2-core CPU: Lightning
    walks and deep-copies its result bookkeeping on each call, Lightning #20388) whether or
    not the logger writes the step, so training metrics are not logged on the other steps
    (``trainer.callback_metrics`` and the progress bar then hold the last logged values).
    ``trainer`` ``None`` (a module outside a Trainer) logs every step.
    """
    if trainer is None:
        return True
    step = trainer.global_step if step is None else step
    every = trainer.log_every_n_steps
    return step == 0 or step + 1 == trainer.max_steps or (every > 0 and (step + 1) % every == 0)


def step_logs(
    stage: str,
    loss: Tensor,
    chunks: Sequence[Chunk],
    terms: Sequence[Mapping[str, Tensor]],
    balancer: Balancer | None,
    extra: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """A step's logged values: ``<stage>/loss``, ``<stage>/<teacher>/<term>`` for every loss
    term of every chunk (mean over images; prefixed by the partition's name,
    ``<stage>/<partition>/<teacher>/<term>``, when the step has several chunks: a teacher may
    be in more than one) and, with the training step's ``balancer``, each term's effective
    weight ``train/balancer/<teacher>/<term>``, and the step's ``extra`` values (full tags, e.g.
    ``train/mesa_loss``).

    Training values are logged per step and never reduced across ranks, so they come to the
    host together (:func:`on_host`): one host-device synchronisation for all of them, where
    Lightning would read each device tensor on its own (the loss three times: for the logger,
    the progress bar and the callbacks). Validation values stay on the device (Lightning
    reduces them across ranks)."""
    logged = {f"{stage}/loss": loss.detach()}
    for chunk, chunk_terms in zip(chunks, terms, strict=True):
        prefix = f"{stage}/" if len(chunks) == 1 else f"{stage}/{chunk.partition}/"
        logged.update({prefix + k: v.detach().mean() for k, v in chunk_terms.items()})
    weights = balancer.effective_weights() if balancer is not None else {}
    logged.update({f"{stage}/balancer/{k}": w for k, w in weights.items()})
    logged.update({k: v.detach() for k, v in (extra or {}).items()})
    return on_host(logged) if stage == "train" else logged


def on_host(values: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``values`` (one-element tensors) as float32 CPU scalars, copied in one transfer.

    Lightning keeps a logged CPU tensor on the CPU, so logging these reads nothing more from
    the device.
    """
    if not values:
        return {}
    host = torch.stack([v.detach().reshape(()).float() for v in values.values()]).cpu()
    return dict(zip(values, host.unbind(), strict=True))


def epoch_logs(stage: str, metrics: DistillationMetrics) -> dict[str, Tensor]:
    """The epoch's ``<stage>/<teacher>/<metric>`` values (already reduced over all ranks by
    torchmetrics; empty if no step updated them); the metrics are reset."""
    values = {f"{stage}/{k}": v for k, v in metrics.compute().items()} if metrics.updated else {}
    metrics.reset()
    return values
