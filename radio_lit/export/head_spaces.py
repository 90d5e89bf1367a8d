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
the run's own. An imported head keeps its published entry too (``published_<name>``): its
NVlabs adaptor ``type`` and ``model`` (SigLIP2's ``siglip2``, whose loader attaches the text
encoder) are what the export writes, not a generic type. A teacher that is the published
model's own backbone output (adapt, extend: the student *is* that model) is no NVlabs teacher:
its name is kept in ``backbone_<name>`` and the export leaves its head out, so the model's
summary tokens meet the published teachers only.
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
        self.register_buffer(f"entry_{name}", _encoded(entry))

    def carried_entries(self) -> dict[str, dict[str, Any]]:
        """The ``args.teachers`` entry of every carried head, by name."""
        return {n: _json(getattr(self, f"entry_{n}")) for n in self.carried}

    def own_backbone(self, name: str) -> None:
        """Teacher ``name`` is the published model's own backbone output: not exported."""
        self.register_buffer(f"backbone_{name}", torch.ones((), dtype=torch.uint8))

    def backbones(self) -> list[str]:
        """The teachers that are the published model's own backbone output."""
        return [n[len("backbone_") :] for n, _ in self.named_buffers() if n.startswith("backbone_")]

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

    def add(self, name: str, width: int, entry: Mapping[str, Any] | None = None) -> None:
        """Teacher ``name``'s head of ``width`` outputs predicts in the teacher's space; its
        published ``args.teachers`` ``entry`` (type, model) is what an export writes."""
        f64 = torch.float64
        self.register_buffer(f"theta_{name}", torch.eye(width, dtype=f64))
        self.register_buffer(f"shift_{name}", torch.zeros(width, dtype=f64))
        if entry is not None:
            self.register_buffer(f"published_{name}", _encoded(entry))
        if name not in self.names:
            self.names.append(name)

    @torch.no_grad()
    def follow(
        self,
        normalizers: Mapping[str, Normalizer],
        heads: Mapping[str, Any],
        ema: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Compose each imported head (the live one, and the EMA student's, ``ema.heads``)
        with its normalizer where the normalizer was fitted since the last composition.

        The composed layer's ``optimizer`` moments are forgotten ``[choice]``: they were
        gathered in the space before (Adam's first moment would have to turn by the inverse
        transpose of the composition, and its second, elementwise, cannot turn at all), so
        the layer's next update starts its moments afresh, as a new parameter's would."""
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
            if optimizer is not None:
                for parameter in heads[name].features.out.parameters():
                    optimizer.state.pop(parameter, None)
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
        entries, own = self.carried_entries(), set(self.backbones())
        kept = {n: h for n, h in heads.items() if n not in own}
        run = [self._published_kind(t) for t in teachers if t["name"] not in own]
        return (
            {**kept, **self.carried},
            self.spaces(normalizers),
            [*run, *(entries[n] for n in self.carried)],
        )

    def _published_kind(self, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with its imported head's published adaptor kind (``type``, ``model``, …);
        the run's name, summary use and token slot stay."""
        published = getattr(self, f"published_{entry['name']}", None)
        if published is None:
            return entry
        own = {k: entry[k] for k in ("name", "use_summary", "token_slot") if k in entry}
        return {**_json(published), **own}

    def _load_from_state_dict(
        self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """A checkpoint's imported and carried heads (a resumed run) come back with it."""
        for key in [k for k in state_dict if k.startswith(prefix + "theta_")]:
            name = key[len(prefix + "theta_") :]
            if name not in self.names:
                self.add(name, state_dict[key].shape[0])
        for key in [k for k in state_dict if k.startswith(prefix + "published_")]:
            name = key[len(prefix + "published_") :]
            self.register_buffer(f"published_{name}", torch.empty_like(state_dict[key]))
        for key in [k for k in state_dict if k.startswith(prefix + "backbone_")]:
            self.own_backbone(key[len(prefix + "backbone_") :])
        for key in [k for k in state_dict if k.startswith(prefix + "entry_")]:
            name = key[len(prefix + "entry_") :]
            if name not in self.carried:
                inner = prefix + f"carried.{name}."
                heads = {k[len(inner) :]: v for k, v in state_dict.items() if k.startswith(inner)}
                self.carry(name, _json(state_dict[key]), heads)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ImportedHeads:
        """Device moves, but no dtype casts of the float64 spaces (as the normalizers')."""
        return super()._apply(keeping_float64(fn), recurse)

    def extra_repr(self) -> str:
        return f"names={self.names}"


def _encoded(entry: Mapping[str, Any]) -> Tensor:
    """An ``args.teachers`` entry as a uint8 buffer (its JSON text)."""
    return torch.tensor(list(json.dumps(dict(entry)).encode()), dtype=torch.uint8)


def _json(buffer: Tensor) -> dict[str, Any]:
    """The entry :func:`_encoded` wrote."""
    return json.loads(bytes(buffer.tolist()))


def _compose(linear: nn.Linear, matrix: Tensor, offset: Tensor) -> None:
    """``linear`` becomes ``x -> matrix @ linear(x) + offset`` (float64, stored in its dtype).

    Under FSDP2 the weight and bias are shards (``DTensor``, dim 0 split over the ranks): each
    rank gathers them (a collective: every rank composes the same heads at the same step, the
    statistics being all-reduced), composes the full matrices and keeps its own rows."""
    weight = _gathered(linear.weight).double()
    bias = weight.new_zeros(weight.shape[0])
    if linear.bias is not None:
        bias = _gathered(linear.bias).double()
    matrix = matrix.to(weight)
    _assign(linear.weight, matrix @ weight)
    if linear.bias is not None:
        _assign(linear.bias, matrix @ bias + offset.to(weight))


def _gathered(tensor: Tensor) -> Tensor:
    """The full tensor of an FSDP2 shard (all-gathered), or ``tensor`` itself."""
    full = getattr(tensor, "full_tensor", None)  # torch.distributed.tensor.DTensor
    return full() if full is not None else tensor


def _assign(parameter: Tensor, value: Tensor) -> None:
    """``parameter`` takes the full ``value``: an FSDP2 shard its own part of it (every rank
    holds the same ``value``, so no data moves)."""
    if hasattr(parameter, "full_tensor"):
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(
            value.to(parameter.dtype), parameter.device_mesh, parameter.placements,
            src_data_rank=None,
        )  # fmt: skip
    parameter.copy_(value)


@dataclass
class HeadSpace:
    """The space a feature head predicts in: teacher features ``y = theta @ h + mu``."""

    theta: Tensor
    mu: Tensor

    def affine(self) -> tuple[Tensor, Tensor]:
        return self.theta.double(), self.mu.double()
