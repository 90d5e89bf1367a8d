"""Loss balancers: combine the per-teacher loss terms into the one loss of a step.

A balancer is built by :class:`~radio_lit.module.DistillationModule` from the run's loss
terms and their fixed weights, ``{"<teacher>/feature_loss": gamma_k,
"<teacher>/summary_loss": lambda_k}`` (``model.feature_weights`` / ``model.summary_weights``,
AM-RADIO section 3.4.1), so a config names only the kind and its options::

    model:
      balancer:
        class_path: radio_lit.losses.AdaLoss
        init_args: {momentum: 0.99}

Each training step, :meth:`Balancer.observe` first sees every chunk's terms of the step once
(on every rank, whatever the number of chunks a rank runs: the one place a balancer may
communicate); the balancer is then called on each chunk's terms ``{"<teacher>/<term>": loss}``
(scalars, or ``[B]`` per image when :attr:`Balancer.per_sample`) and returns its total. Any
subset of its terms may be given (a rank that runs only some teachers). Its state (moving
averages, learned parameters) is module state: checkpointed, restored on resume, and not taken by
``model.init_from`` (a new stage starts it afresh). :meth:`Balancer.effective_weights` gives
the weight each term had in the last total, for the logger (``train/balancer/<teacher>/<term>``).
Validation and test call no :meth:`Balancer.observe`; in ``eval()`` mode balancers change no
state and draw no random numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.losses.feature import Loss

_TINY = torch.finfo(torch.float32).tiny

__all__ = ["AdaLoss", "Balancer", "BalancerFactory", "TeacherDropping", "Uncertainty", "Weighted"]


class Balancer(nn.Module):
    """Combines loss terms ``{"<teacher>/<term>": loss}`` into the total loss.

    Args:
        terms: every loss term of the run, ``"<teacher>/<term>"``, with its fixed weight
            (``>= 0``; 0 removes the term from the total).
    """

    per_sample: ClassVar[bool] = False
    """Whether :meth:`forward` takes per-image terms ``[B]`` instead of scalars."""

    def __init__(self, terms: Mapping[str, float]) -> None:
        super().__init__()
        if not terms:
            raise ValueError(f"{type(self).__name__} needs at least one loss term")
        for key, weight in terms.items():
            if key.count("/") != 1:
                raise ValueError(f"loss term {key!r} is not named '<teacher>/<term>'")
            if not weight >= 0.0 or weight == float("inf"):
                raise ValueError(
                    f"model.feature_weights / model.summary_weights: the weight of {key!r} "
                    f"must be a finite number >= 0, got {weight}"
                )
        self.terms = {key: float(weight) for key, weight in terms.items()}
        self.index = {key: i for i, key in enumerate(self.terms)}
        self.register_buffer("weights", torch.tensor(list(self.terms.values())), persistent=False)

    def observe(self, chunks: Sequence[Mapping[str, Tensor]], fractions: Sequence[float]) -> None:
        """Update the state from one training step's terms, before the step's totals.

        Called exactly once per training step on every rank (a collective for balancers
        whose state is shared across ranks), with the terms of each chunk this rank runs
        (possibly none) and each chunk's fraction of its partition's batch (``1 / |R_p|``,
        :class:`radio_lit.training.partitions.Chunk`), so that a partition counts once whatever the
        number of ranks it is split over. Stateless balancers ignore it.
        """

    def forward(self, losses: Mapping[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def effective_weights(self) -> dict[str, Tensor]:
        """``{"<teacher>/<term>": w}``: each term's weight in the last total (detached)."""
        raise NotImplementedError

    def check_losses(self, *losses: nn.Module) -> None:
        """Raise if a balancer that needs per-image terms is given losses that lack them."""
        if self.per_sample and not all(isinstance(loss, Loss) for loss in losses):
            raise ValueError(
                f"model.balancer {type(self).__name__} needs per-image losses: model.loss and "
                "model.summary_loss must be radio_lit.losses losses (MSE, Cosine, HybridMSE, "
                "HybridSmoothL1) or subclasses of radio_lit.losses.Loss"
            )

    def _stack(self, losses: Mapping[str, Tensor]) -> tuple[list[int], Tensor]:
        """Indices of the given terms in :attr:`terms` and their values stacked, ``[T, ...]``."""
        unknown = sorted(set(losses) - set(self.index))
        if unknown:
            raise KeyError(f"loss terms {unknown} are not among the balancer's {list(self.index)}")
        return [self.index[key] for key in losses], torch.stack(list(losses.values()))

    def extra_repr(self) -> str:
        return f"terms={self.terms}"


BalancerFactory = Callable[[dict[str, float]], Balancer]
"""Builds a balancer from the run's terms and fixed weights (``model.balancer``)."""


class Weighted(Balancer):
    """Naive balancing, ``sum_k gamma_k L_feat,k + lambda_k L_sum,k`` (AM-RADIO 3.4.1).

    The fixed weights are ``model.feature_weights`` and ``model.summary_weights`` (default 1).
    """

    def forward(self, losses: Mapping[str, Tensor]) -> Tensor:
        total = 0.0
        for key, value in losses.items():
            total = total + self.terms[key] * value
        return total  # type: ignore[return-value]

    def effective_weights(self) -> dict[str, Tensor]:
        return dict(zip(self.terms, self.weights, strict=True))


class AdaLoss(Balancer):
    """Each term divided by a moving average of itself (AM-RADIO supplement E.2, eq. 7).

    ``lambda_t = w_t / E[L_t]`` with ``E[L_t]`` an exponential moving average (momentum 0.99 in
    AM-RADIO 3.4.1), so every term is about ``w_t`` (PHI-S A.9.1: "sets each loss term to be
    approximately 1"; PHI-S tables 11-14 "Ada-"). Hu et al.'s AdaLoss treats the weights as
    constants: the average is of the detached loss values and gets no gradient.

    Update rule, once per training step (:meth:`observe`, before dividing): ``E <- m E +
    (1 - m) L`` with ``L`` the term's mean over every partition that has it this step, on
    every rank (one all-reduce per step over the world; a partition split over ``n`` ranks
    counts ``1/n`` on each), so every rank holds the same average, a teacher in two
    partitions of one rank is updated once, one rank running several partitions equals
    several ranks running one each, and the checkpoint is exact. The papers do not state the
    initialization; here the average starts at the first observed value, so the first step's
    terms are each exactly ``w_t``; a term never observed (validation before the first
    training step) is divided by its own detached value, ``w_t`` again, never by ~0.

    Args:
        terms: see :class:`Balancer`.
        momentum: ``m``, the moving average's momentum, in ``[0, 1)``.
    """

    def __init__(self, terms: Mapping[str, float], momentum: float = 0.99) -> None:
        super().__init__(terms)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(
                f"model.balancer.init_args.momentum must lie in [0, 1), got {momentum}"
            )
        self.momentum = momentum
        size = len(self.terms)
        self.register_buffer("average", torch.zeros(size, dtype=torch.float32))
        self.register_buffer("seen", torch.zeros(size, dtype=torch.bool))

    @torch.no_grad()
    def observe(self, chunks: Sequence[Mapping[str, Tensor]], fractions: Sequence[float]) -> None:
        """Fold this step's values, averaged over partitions and ranks, into the averages."""
        sums = torch.zeros(2, len(self.terms), dtype=torch.float32, device=self.average.device)
        for losses, fraction in zip(chunks, fractions, strict=True):
            index, values = self._stack(losses)
            sums[0, index] += fraction * values.detach().float().to(sums.device)
            sums[1, index] += fraction
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)  # once per step on every rank, whatever its chunks
        present = sums[1] > 0
        mean = sums[0] / torch.where(present, sums[1], 1.0)
        blended = torch.where(
            self.seen, self.momentum * self.average + (1.0 - self.momentum) * mean, mean
        )
        self.average.copy_(torch.where(present, blended, self.average))
        self.seen |= present

    def forward(self, losses: Mapping[str, Tensor]) -> Tensor:
        index, values = self._stack(losses)
        own = values.detach().abs()
        denominator = torch.where(self.seen[index], self.average[index], own)
        return (self.weights[index] * values / denominator.clamp_min(_TINY)).sum()

    def effective_weights(self) -> dict[str, Tensor]:
        average = torch.where(self.seen, self.average, torch.ones_like(self.average))
        weights = self.weights / average.clamp_min(_TINY)
        return dict(zip(self.terms, weights, strict=True))


class Uncertainty(Balancer):
    """Learned uncertainty weighting in AM-RADIO's softplus form (supplement E.1, eq. 6).

    ``L = sum_t w_t exp(-b_t) L_t + softplus(b_t)``, with ``b_t`` (Kendall et al.'s
    ``log sigma_t^2``) a learned parameter per term, ``log_variance [T]``, initialized to 0 so
    the weights start at 1 ("matching the naive weighting"). AM-RADIO writes ``b`` as a learned
    function of the student's features; this balancer learns one value per term (the
    homoscedastic form of Kendall et al., eq. 4-5 of the supplement). Terms whose fixed weight
    is 0 add nothing, not even their ``softplus`` term.

    ``log_variance`` is trained by the run's optimizer (it is yielded by
    ``DistillationModule.trainable_parameters()`` as ``balancer.log_variance``, a 1-D
    parameter, hence without weight decay).

    Args:
        terms: see :class:`Balancer`.
    """

    def __init__(self, terms: Mapping[str, float]) -> None:
        super().__init__(terms)
        self.log_variance = nn.Parameter(torch.zeros(len(self.terms)))
        self.register_buffer("active", self.weights > 0, persistent=False)
        # b as used by the last forward: under FSDP2 the parameter is a shard outside forward.
        self.register_buffer("last_log_variance", torch.zeros(len(self.terms)), persistent=False)

    def forward(self, losses: Mapping[str, Tensor]) -> Tensor:
        index, values = self._stack(losses)
        self.last_log_variance.copy_(self.log_variance.detach())
        b = self.log_variance[index]
        weighted = self.weights[index] * torch.exp(-b) * values
        return (weighted + F.softplus(b) * self.active[index]).sum()

    def effective_weights(self) -> dict[str, Tensor]:
        weights = self.weights * torch.exp(-self.last_log_variance)
        return dict(zip(self.terms, weights, strict=True))


class TeacherDropping(Balancer):
    """Per image, keep the teacher with the highest loss and drop each other with probability p.

    UNIC's teacher dropping (Sariyildiz et al., 2024; ``modeling/teacher_dropping.py`` of
    naver/unic). For image ``b`` and teacher ``k``, ``L_kb = sum_t w_t L_tb`` over the
    teacher's terms (feature and summary); the teacher with the largest ``L_kb`` is kept, every
    other one is kept with probability ``1 - p`` (coefficients ``c_kb`` in ``{0, 1}``, detached),
    and ``total = K * sum_kb c_kb L_kb / sum_kb c_kb`` for ``K`` teachers. UNIC divides by
    ``sum c`` (the mean over kept image-teacher pairs); the factor ``K`` is this project's, so
    that with nothing dropped (``p = 0``, or ``eval()``) the total equals :class:`Weighted`'s.

    The draws come from torch's global RNG (on the losses' device), so seeded runs reproduce
    and restoring the RNG state on resume restores them; none are drawn in ``eval()`` mode.
    Every term must cover the same images (one batch for all teachers).

    Args:
        terms: see :class:`Balancer`.
        p: probability of dropping each teacher but the hardest, per image, in ``[0, 1]``.
    """

    per_sample = True

    def __init__(self, terms: Mapping[str, float], p: float = 0.5) -> None:
        super().__init__(terms)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"model.balancer.init_args.p must lie in [0, 1], got {p}")
        self.p = p
        teachers = list(dict.fromkeys(key.split("/")[0] for key in self.terms))
        self.teacher_of = {key: teachers.index(key.split("/")[0]) for key in self.terms}
        # Per teacher index: sum_b c_kb * K / sum c of the last step (its terms' weight factor).
        self._coefficients: dict[int, Tensor | float] = dict.fromkeys(range(len(teachers)), 1.0)

    def forward(self, losses: Mapping[str, Tensor]) -> Tensor:
        shapes = {tuple(v.shape) for v in losses.values()}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise ValueError(
                "TeacherDropping needs every loss term per image on the same images ([B] "
                f"each), got shapes {sorted(shapes)}; run all teachers on one batch (no "
                "partitions) with this balancer"
            )
        grouped: dict[int, Tensor] = {}
        for key, value in losses.items():
            k, weighted = self.teacher_of[key], self.terms[key] * value
            grouped[k] = grouped[k] + weighted if k in grouped else weighted
        per_teacher = torch.stack(list(grouped.values()))  # L_kb, [K, B]
        keep = torch.ones_like(per_teacher, dtype=torch.bool)
        if self.training and self.p > 0:
            with torch.no_grad():
                hardest = F.one_hot(per_teacher.argmax(0), len(grouped)).T.bool()
                keep = (torch.rand_like(per_teacher) >= self.p) | hardest
        coefficients = keep.to(per_teacher.dtype)
        scale = len(grouped) / coefficients.sum()
        self._coefficients = dict(zip(grouped, coefficients.sum(1) * scale, strict=True))
        return scale * (coefficients * per_teacher).sum()

    def effective_weights(self) -> dict[str, Tensor]:
        return {
            key: self.weights[i] * self._coefficients.get(self.teacher_of[key], 0.0)
            for key, i in self.index.items()
        }
