"""LAMB (You et al. 2020; PHI-S table 10) with its parameter update compiled by ``torch.compile``.

timm's ``Lamb`` takes ~15 passes over memory per parameter tensor in its multi-tensor step
(each ``torch._foreach_*`` op reads and writes every tensor): on an H200 the stage-1 update costs
~9x a fused AdamW's (benchmarks/README.md, "train_step.py"). Compiled by inductor, the same
math (timm's own functional ``lamb``) runs as a few fused kernels (benchmarks/README.md,
"optimizer_step.py").

:class:`Lamb` is timm's ``Lamb`` (same arguments, same ``state_dict``: per-parameter
``exp_avg``/``exp_avg_sq``, a per-group ``step`` counter on the CPU) whose ``step`` runs the
closure (Lightning's forward and backward) eagerly and then one compiled call of
:func:`lamb_update` over every parameter group. What changes each step reaches the compiled
code as tensors: the learning rate (the schedule's, read from the group) and the bias
corrections ``1 - beta ** step`` (computed on the host as timm does, in double precision), kept
in per-group scalar tensors on the parameters' device and refilled before each call; the step
counter stays in the group. A schedule or the step count never recompiles: a graph is compiled
once per set of groups that have gradients (once more when ``FreezeBody`` releases the trunk).
The update is timm's, the scalars' rounding to float32 apart. Under FSDP2 the parameters are
``DTensor`` shards: the compiled graph holds the all-reduces of the trust ratios' norms
(tested on 2 gloo ranks, torch 2.11 and 2.14).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import timm.optim
import torch
from timm.optim.lamb import lamb
from torch import Tensor
from torch._dynamo.exc import TorchDynamoException
from torch._dynamo.utils import counters

from radio_lit.core.compiling import CompileOption, CompileStats, allow_recompiles

__all__ = ["Lamb", "compiles_by_default", "lamb_update"]


def lamb_update(groups: list[dict[str, Any]], clip_grad_norm: Tensor | None) -> None:
    """timm's functional LAMB update (``timm.optim.lamb.lamb``) of every group, in place.

    Args:
        groups: one mapping per group of ``lamb``'s arguments: the lists ``params``, ``grads``,
            ``exp_avgs``, ``exp_avg_sqs`` (tensors of each parameter's shape), the 0-dim
            tensors ``lr``, ``bias_correction1``, ``bias_correction2``, and the group's constant
            settings (``beta1``, ``beta2``, ``beta3``, ``eps``, ``weight_decay``...).
        clip_grad_norm: the divisor of every gradient: ``max(1, global norm / max_grad_norm)``
            (0-dim; ``None``: no clipping).
    """
    for arguments in groups:
        lamb(**arguments, clip_grad_norm=clip_grad_norm)


def compiles_by_default(params: list[Tensor]) -> bool:
    """Whether :class:`Lamb` compiles its update when the config does not say: on CUDA
    parameters (FSDP2's ``DTensor`` shards included). On a CPU the compiled update is 4.6x
    faster per step for stage 1's ViT-L, but compiling it takes ~2 minutes (~45 steps' gain;
    ~20 s, ~275 steps, at the tests' CPU size, where every test stepping a LAMB config would
    pay it): eager there (benchmarks/README.md, "optimizer_step.py"). [choice]"""
    return bool(params) and all(p.device.type == "cuda" for p in params)


class Lamb(timm.optim.Lamb):
    """timm's ``Lamb`` whose update is compiled (the module docstring says how).

    Args:
        params: parameters or parameter groups, as timm's ``Lamb``.
        compiled: ``True``: the compiled update; a mapping: ``torch.compile``'s keyword
            arguments (``dynamic`` defaults to ``False``); ``False``: timm's eager step; ``None``
            (default): compiled where that is faster (:func:`compiles_by_default`, decided at the
            first step). A machine where the update cannot compile (no C++ compiler for
            inductor, no Triton) takes the eager step, with one warning naming the reason.
        foreach: timm's multi-tensor step, on every device by default (timm's own default
            takes it on CUDA only). [choice]
        **settings: timm ``Lamb``'s other arguments (``lr``, ``betas``, ``eps``,
            ``weight_decay``, ``max_grad_norm``, ``trust_clip``, ``always_adapt``...).

    Attributes:
        stats: what compiling cost (graphs, frames, seconds; ``recompiles``: compilations after
            the first, e.g. when ``FreezeBody`` releases the trunk).
    """

    def __init__(
        self,
        params: Any,
        compiled: CompileOption | None = None,
        foreach: bool = True,
        **settings: Any,
    ) -> None:
        super().__init__(params, foreach=foreach, **settings)
        self.compiled = compiled
        self.stats = CompileStats()
        self._update: Callable[[list[dict[str, Any]], Tensor | None], None] | None = None
        self._scalars: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def compiles(self) -> bool:
        """Whether :meth:`step` runs the compiled update (``compiled``, else the default for
        the parameters, decided once they exist on their device)."""
        if self.compiled is None:
            params = [p for group in self.param_groups for p in group["params"]]
            self.compiled = compiles_by_default(params)
        return self.compiled is not False

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One LAMB step: ``closure`` (forward and backward) eagerly, then the update, compiled
        (:func:`lamb_update`) or timm's own eager step."""
        if not self.compiles():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        clip = self._get_clip_grad_norm()  # timm's: eager, a few operations
        groups = [a for i, g in enumerate(self.param_groups) if (a := self._arguments(i, g))]
        self._compiled_update(groups, clip)
        return loss

    def _arguments(self, index: int, group: dict[str, Any]) -> dict[str, Any] | None:
        """``lamb``'s arguments for group ``index`` (timm ``Lamb.step``'s book-keeping: the step
        counter counts every step, a group without gradients is skipped, state is created at a
        parameter's first update), or ``None`` when it has no gradient."""
        if "step" not in group:
            group["step"] = torch.tensor(0.0)  # timm's counter: on the CPU, default dtype
        group["step"].add_(1)
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return None
        beta1, beta2 = group["betas"]
        step = group["step"].item()
        corrections = (1 - beta1**step, 1 - beta2**step) if group["bias_correction"] else (1, 1)
        if index not in self._scalars:
            self._scalars[index] = torch.zeros(3, device=params[0].device).unbind()
        lr, correction1, correction2 = self._scalars[index]
        for scalar, value in zip(self._scalars[index], (group["lr"], *corrections), strict=True):
            scalar.fill_(value)
        for p in params:
            if not self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p)
                self.state[p]["exp_avg_sq"] = torch.zeros_like(p)
        decoupled = group.get("decoupled_decay", False)
        corrected = decoupled and group["corrected_weight_decay"]
        return dict(
            params=params,
            grads=[p.grad for p in params],
            exp_avgs=[self.state[p]["exp_avg"] for p in params],
            exp_avg_sqs=[self.state[p]["exp_avg_sq"] for p in params],
            foreach=group["foreach"],
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            beta3=1 - beta1 if group["grad_averaging"] else 1.0,
            bias_correction1=correction1,
            bias_correction2=correction2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled_decay=decoupled,
            max_lr=group["max_lr_snapshot"] if corrected else None,
            trust_clip=group["trust_clip"],
            always_adapt=group["always_adapt"],
            caution=group["caution"],
        )

    def _compiled_update(self, groups: list[dict[str, Any]], clip: Tensor | None) -> None:
        """:func:`lamb_update` compiled (built at the first call), counted in :attr:`stats`;
        where it cannot compile, eagerly, with one warning, and timm's step from then on."""
        if self._update is None:
            kwargs = {} if self.compiled is True else dict(self.compiled)
            allow_recompiles(self)
            self._update = torch.compile(lamb_update, **{"dynamic": False, **kwargs})
        frames, graphs = counters["frames"]["total"], counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        try:
            self._update(groups, clip)
        except TorchDynamoException as error:  # raised before the compiled code ran
            cause = getattr(error, "inner_exception", None) or error  # the backend's own
            first_line = (str(cause).strip() or "no message").splitlines()[0]
            reason = f"{type(cause).__name__}: {first_line}"
            warnings.warn(
                f"LAMB's update could not be compiled ({reason}); it runs eagerly (timm's "
                "step). radio_lit.training.lamb.Lamb's compiled: false skips the attempt",
                stacklevel=3,
            )
            self.compiled = False
            lamb_update(groups, clip)
            return
        if new_frames := counters["frames"]["total"] - frames:
            self.stats.recompiles += new_frames if self.stats.frames else 0
            self.stats.frames += new_frames
            self.stats.graphs += counters["stats"]["unique_graphs"] - graphs
            self.stats.seconds += time.perf_counter() - start
