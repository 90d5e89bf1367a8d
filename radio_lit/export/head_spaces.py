"""Imported heads kept in their teachers' spaces while the run's normalizers are fitted.

A published feature head predicts its teacher's own features (radio-lit's export folds each
normalizer into its head, PHI-S A.6, eqs. 42-44; NVlabs' heads are trained so). The run's
loss compares the head's output with the *normalized* target ``y' = W_n (y - mu_n)``. So once
the run has estimated its statistics (``TeacherStatsEstimation``), an imported head is
composed with that normalizer: the forward affine folded into its last linear layer,

    ``W' = W_n Θ_s W``,  ``b' = W_n (Θ_s b + mu_s - mu_n)``,

where ``y = Θ_s h + mu_s`` is the space the head predicts in before (the identity for a
published head: its teacher's space). Each refit during estimation composes again from the
space the last one left (``Θ_s, mu_s`` become the new normalizer's ``affine()``), so the head
keeps predicting the same teacher features and the loss right after estimation is the
source's own fidelity, not a fresh head's. ``Θ_s`` and ``mu_s`` are buffers (float64,
``theta_<teacher> [C, C]``, ``shift_<teacher> [C]``): a resumed run composes as the
uninterrupted one, and an export folds each imported head with the space it is in
(:meth:`ImportedHeads.spaces`).

The heads a published model ships for teachers the run does not have are carried, untrained
(``carried.<name>.features|summary.*``, with their ``args.teachers`` entry as JSON in the
buffer ``entry_<name>``), so that an export in NVlabs' layout keeps them bit for bit beside
the run's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from radio_lit.core.dtypes import keeping_float64
from radio_lit.normalizers import Normalizer
from radio_lit.students import TeacherHeads


class ImportedHeads(nn.Module):
    """The teachers whose feature heads came from a published model, and the space each
    head predicts in now (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.carried = nn.ModuleDict()

    def carry(self, name: str, entry: Mapping[str, Any], state: Mapping[str, Tensor]) -> None:
        """Keep the shipped heads ``state`` (``features.*``, ``summary.*``, radio-lit names) of
        a teacher this run lacks, and its ``args.teachers`` ``entry``, for the export."""
        heads = TeacherHeads.from_state(state)
        heads.load_state_dict(state, strict=True)
        self.carried[name] = heads.requires_grad_(False)
        text = json.dumps(dict(entry)).encode()
        self.register_buffer(f"entry_{name}", torch.tensor(list(text), dtype=torch.uint8))

    def carried_entries(self) -> dict[str, dict[str, Any]]:
        """The ``args.teachers`` entry of every carried head, by name."""
        return {n: json.loads(bytes(getattr(self, f"entry_{n}").tolist())) for n in self.carried}

    def spaces(self, normalizers: Mapping[str, Any]) -> dict[str, Any]:
        """What an export folds into each feature head (``affine()``, PHI-S A.6): an imported
        head's own space, a carried head's identity, the run's normalizer for the others."""
        spaces = dict(normalizers)
        for name in self.names:
            spaces[name] = HeadSpace(getattr(self, f"theta_{name}"), getattr(self, f"shift_{name}"))
        for name, heads in self.carried.items():
            width = heads.features.out.out_features
            spaces[name] = HeadSpace(torch.eye(width, dtype=torch.float64), torch.zeros(width))
        return spaces

    def add(self, name: str, width: int) -> None:
        """Teacher ``name``'s head of ``width`` outputs predicts in the teacher's space."""
        f64 = torch.float64
        self.register_buffer(f"theta_{name}", torch.eye(width, dtype=f64))
        self.register_buffer(f"shift_{name}", torch.zeros(width, dtype=f64))
        if name not in self.names:
            self.names.append(name)

    @torch.no_grad()
    def follow(
        self, normalizers: Mapping[str, Normalizer], heads: Mapping[str, Any], ema: Any = None
    ) -> None:
        """Compose each imported head (the live one, and the EMA student's, ``ema.heads``)
        with its normalizer where the normalizer was fitted since the last composition."""
        groups = [heads] if ema is None else [heads, ema.heads]
        for name in self.names:
            normalizer = normalizers[name]
            if not normalizer.is_fitted:
                continue
            theta, mu = normalizer.affine()
            old_theta, old_mu = getattr(self, f"theta_{name}"), getattr(self, f"shift_{name}")
            if torch.equal(theta, old_theta) and torch.equal(mu, old_mu):
                continue
            forward = normalizer.weight.double()
            if normalizer.elementwise:
                forward = forward.diag_embed()
            for group in groups:
                _compose(group[name].features.out, forward @ old_theta, forward @ (old_mu - mu))
            old_theta.copy_(theta)
            old_mu.copy_(mu)

    def exported(
        self,
        heads: Mapping[str, TeacherHeads],
        normalizers: Mapping[str, Any],
        teachers: list[dict[str, Any]],
    ) -> tuple[dict[str, TeacherHeads], dict[str, Any], list[dict[str, Any]]]:
        """What an export writes: the run's ``heads`` and the carried ones, what to fold into
        each (:meth:`spaces`), the ``args.teachers`` entries (the run's ``teachers``, then the
        carried heads' own)."""
        entries = self.carried_entries()
        return (
            {**heads, **self.carried},
            self.spaces(normalizers),
            [*teachers, *(entries[n] for n in self.carried)],
        )

    def _load_from_state_dict(
        self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """A checkpoint's imported and carried heads (a resumed run) come back with it."""
        for key in [k for k in state_dict if k.startswith(prefix + "theta_")]:
            name = key[len(prefix + "theta_") :]
            if name not in self.names:
                self.add(name, state_dict[key].shape[0])
        for key in [k for k in state_dict if k.startswith(prefix + "entry_")]:
            name = key[len(prefix + "entry_") :]
            if name not in self.carried:
                inner = prefix + f"carried.{name}."
                heads = {k[len(inner) :]: v for k, v in state_dict.items() if k.startswith(inner)}
                self.carry(name, json.loads(bytes(state_dict[key].tolist())), heads)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ImportedHeads:
        """Device moves, but no dtype casts of the float64 spaces (as the normalizers')."""
        return super()._apply(keeping_float64(fn), recurse)

    def extra_repr(self) -> str:
        return f"names={self.names}"


def _compose(linear: nn.Linear, matrix: Tensor, offset: Tensor) -> None:
    """``linear`` becomes ``x -> matrix @ linear(x) + offset`` (float64, stored in its dtype)."""
    weight = linear.weight.double()
    bias = linear.bias.double() if linear.bias is not None else weight.new_zeros(weight.shape[0])
    linear.weight.copy_(matrix.to(weight) @ weight)
    if linear.bias is not None:
        linear.bias.copy_(matrix.to(weight) @ bias + offset.to(weight))


@dataclass
class HeadSpace:
    """The space a feature head predicts in: teacher features ``y = theta @ h + mu``."""

    theta: Tensor
    mu: Tensor

    def affine(self) -> tuple[Tensor, Tensor]:
        return self.theta.double(), self.mu.double()
