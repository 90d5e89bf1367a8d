"""Spectral reparametrization (σReparam) of the student's linear layers.

Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse",
eq. 3: every linear weight is used as ``W_hat = (gamma / sigma(W)) * W``, where ``sigma(W)`` is
the spectral norm of ``W``, estimated by one power iteration per training step (``u``, ``v``
persist between steps; the gradient flows through ``sigma = u^T W v``), and ``gamma`` is a
learned scale. "Per step", not per forward: a step may run the student more than once (a rank
running several teacher partitions), and the estimate must not depend on how a step's work is
split across ranks. :func:`spectral_step` (the scope of a training step) runs that iteration and
computes the effective weights of all layers together, once per step, in a few batched
operations (per layer and per forward, σReparam made the student's forward dispatch
9x the operations of a plain ViT); under FSDP2 this needs every layer's weight gathered at
the step's first forward (the student one FSDP2 unit: :class:`~radio_lit.students.sharding.
FSDP2`), else each layer does it on its next training forward, where FSDP2 has gathered its
weight (:func:`request_power_iteration`).
AM-RADIO 4 ("High-Resolution ViT Student") and PHI-S A.7 apply it to the
student for all training stages, and PHI-S A.7 puts weight decay on the scale "to encourage
the spectral norm to be small" — hence :data:`SPECTRAL_SCALE`, the parameter-name suffix the
optimizer must always decay.

How the learned parameter ``p`` (``spectral_scale``) gives ``gamma``, NVlabs/RADIO's two
versions (``radio/enable_spectral_reparam.py``, ``_SNReweight.version``):

- version 1 (Zhai et al.; the default here): ``gamma = p``. Weight decay pulls ``gamma``
  toward 0, unbounded below: PHI-S A.7's "encourage the spectral norm to be small".
- version 2 (NVlabs/RADIO's current default): ``gamma = softplus(p) + 0.05``
  (:data:`MIN_SPECTRAL_SCALE`). Weight decay pulls ``p`` toward 0, so ``gamma`` toward
  ``ln 2 + 0.05 ≈ 0.743``, and ``gamma`` never falls below 0.05.

As in NVlabs/RADIO, the fused ``qkv`` projection is reparametrized per chunk (q, k and v each
get their own ``sigma`` and ``gamma``), and ``gamma`` starts at ``sigma(W)`` so that
reparametrizing leaves the function unchanged (a pretrained student starts from its pretrained
weights; in version 2 a chunk with ``sigma(W) < 0.05`` starts at ``gamma = 0.05 + 1e-5``).

For export, :func:`fold_spectral_reparam` replaces each :class:`SpectralLinear` by a plain
``nn.Linear`` holding ``W_hat`` (with the eval-mode ``sigma``), under the same name.

State-dict names of one reparametrized layer (``C`` chunks; 3 for ``qkv``, else 1):
``weight [out, in]``, ``bias [out]``, ``spectral_scale [C]`` (``p``; a parameter),
``spectral_u [C, out / C]`` and ``spectral_v [C, in]`` (float32 power-iteration buffers),
``spectral_version []`` (version 2 only: a state dict without it is version 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SPECTRAL_SCALE = "spectral_scale"
"""Name of the scale parameter ``p``; weight decay always applies to it (PHI-S A.7)."""
MIN_SPECTRAL_SCALE = 0.05
"""Version 2's lower bound on ``gamma`` (NVlabs/RADIO's ``alpha``)."""
VERSIONS = (1, 2)

_INIT_POWER_ITERATIONS = 20
_EPS = 1e-12
_MIN_SOFTPLUS = 1e-5  # NVlabs/RADIO's smallest softplus value at initialization


@torch.no_grad()
def _power_iteration(mats: Tensor, u: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """``steps`` power iterations on ``mats [K, m, n]`` from ``u [K, m]``: unit ``(u, v)``."""
    u = u.unsqueeze(-1)
    for _ in range(steps):
        v = _unit(mats.mT @ u)
        u = _unit(mats @ v)
    return u.squeeze(-1), v.squeeze(-1)


def _unit(x: Tensor) -> Tensor:
    """``x [K, d, 1]`` scaled to unit norm along ``d`` (``F.normalize`` in three operations)."""
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(_EPS)


def _sigma(mats: Tensor, u: Tensor, v: Tensor) -> Tensor:
    """``[K, 1, 1]`` spectral-norm estimates ``u^T W v`` of ``mats [K, m, n]``."""
    return (u.unsqueeze(1) @ mats @ v.unsqueeze(-1)).clamp_min(_EPS)


@torch.no_grad()
def _converged_state(mats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(u, v, sigma)`` of ``mats [C, m, n]`` after :data:`_INIT_POWER_ITERATIONS` steps from a
    fixed start (the same on every rank; the global RNG is left alone)."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(mats.shape[:2], generator=generator, device="cpu").to(mats.device)
    u, v = _power_iteration(mats, F.normalize(start, dim=-1), _INIT_POWER_ITERATIONS)
    return u, v, _sigma(mats, u, v).reshape(-1)


@torch.no_grad()
def _exact_state(mats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(u, v, sigma)`` of ``mats [C, m, n]``: the top singular vectors themselves, from the
    top eigenvector of the smaller Gram matrix in float64, so the power iteration's fixed
    point. A model loaded so computes the same function after any number of training steps
    at learning rate 0; :func:`_converged_state`'s 20 iterations from a random start reach
    0.94-1.0 of ``sigma`` on random weights, and every step's iteration would then move the
    function with no learning."""
    wide = mats.double()
    tall = wide.shape[1] >= wide.shape[2]
    gram = wide.mT @ wide if tall else wide @ wide.mT  # [C, k, k], k = min(m, n)
    top = torch.linalg.eigh(gram).eigenvectors[..., -1]  # [C, k], eigenvalues ascending
    other = F.normalize((wide if tall else wide.mT) @ top.unsqueeze(-1), dim=1).squeeze(-1)
    u, v = (other, top) if tall else (top, other)
    u, v = u.to(mats.dtype), v.to(mats.dtype)
    return u, v, _sigma(mats, u, v).reshape(-1)


def _inverse_softplus(t: Tensor) -> Tensor:
    """``p`` with ``softplus(p) = t`` (``t > 0``): ``log(expm1(t))``, stable for large ``t``."""
    return t + torch.log(-torch.expm1(-t))


def request_power_iteration(module: nn.Module) -> None:
    """Make every :class:`SpectralLinear` in ``module`` run one power iteration on its next
    training forward: once per optimizer step, however many forwards the step makes."""
    for layer in module.modules():
        if isinstance(layer, SpectralLinear):
            layer.power_iteration_due = True


@contextmanager
def spectral_step(module: nn.Module) -> Iterator[None]:
    """One training step of every :class:`SpectralLinear` in ``module``: one power iteration
    (:func:`request_power_iteration`) and the effective weights of all layers computed together,
    by :func:`effective_weights`, at the step's first training forward, then shared by every
    forward of the step (a rank running several partitions). Leaving the scope forgets them:
    the next step (after the optimizer's update) computes new ones.

    Under FSDP2 with the student as one unit (``model.fsdp2.layout: student``) every weight
    is gathered when the first forward asks; with a unit per block (``blocks``) the other
    blocks' weights are still shards then, so each layer computes its own effective weight at
    each forward (as outside this scope), with one power iteration on its first forward of
    the step. Either way the same function of the same weights.
    """
    layers = [m for m in module.modules() if isinstance(m, SpectralLinear)]
    request_power_iteration(module)
    step = _Step(layers)
    for layer in layers:
        layer.current_step = step
    try:
        yield
    finally:
        for layer in layers:
            layer.current_step = None


class _Step:
    """The effective weights of one training step, computed at the first request."""

    def __init__(self, layers: list[SpectralLinear]) -> None:
        self.layers = layers
        self.batched: bool | None = None  # known at the first request (FSDP2 gathers then)
        self.weights: dict[nn.Module, Tensor] = {}
        self.with_grad = False

    def weight(self, layer: SpectralLinear) -> Tensor:
        if self.batched is None:
            self.batched = not any(_is_sharded(other.weight) for other in self.layers)
        if not self.batched:
            return effective_weights([layer])[0]
        if not self.weights or (torch.is_grad_enabled() and not self.with_grad):
            # (again if a no-grad forward came first: the gradient must reach W and the scale)
            self.with_grad = torch.is_grad_enabled()
            self.weights = dict(zip(self.layers, effective_weights(self.layers), strict=True))
        return self.weights[layer]


def _is_sharded(weight: Tensor) -> bool:
    """Whether ``weight`` is an FSDP2 shard (a ``DTensor``) rather than the full weight."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(weight, DTensor)


def effective_weights(layers: list[SpectralLinear]) -> list[Tensor]:
    """``[out, in]`` per layer: ``gamma_c / sigma_c * W_c`` per chunk (eq. 3), the one place
    where a :class:`SpectralLinear`'s applied weight is made.

    Layers in training mode with a power iteration due first refine ``u``, ``v`` (one
    iteration, no gradient). Chunks of the same shape ``[m, n]`` (and version, dtype, device)
    are computed together as one ``[K, m, n]`` batch, whatever layer they belong to: on a ViT,
    three batches (every q, k, v and proj chunk; every fc1; every fc2) instead of one chain of
    small operations per layer. ``sigma`` is computed in float32 whatever the weight dtype; the
    gradient flows through ``sigma`` to ``W`` and through ``gamma`` to ``spectral_scale``.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, layer in enumerate(layers):
        refine = layer.training and layer.power_iteration_due
        key = (*layer.spectral_v.shape[1:], *layer.spectral_u.shape[1:], layer.version, refine)
        groups.setdefault((*key, layer.weight.dtype, layer.weight.device), []).append(i)
    weights: dict[int, Tensor] = {}
    for indices in groups.values():
        weights.update(
            zip(indices, _chunk_batch_weights([layers[i] for i in indices]), strict=True)
        )
    return [weights[i] for i in range(len(layers))]


def _chunk_batch_weights(layers: list[SpectralLinear]) -> list[Tensor]:
    """:func:`effective_weights` of ``layers`` whose chunks all have one shape ``[m, n]``."""
    first = layers[0]
    rows, cols = first.spectral_u.shape[1], first.in_features
    weight = torch.cat([layer.weight for layer in layers])  # [sum(out), n]
    mats = (weight if weight.dtype == torch.float32 else weight.float()).view(-1, rows, cols)
    u = torch.cat([layer.spectral_u for layer in layers])  # [K, m]
    v = torch.cat([layer.spectral_v for layer in layers])  # [K, n]
    if first.training and first.power_iteration_due:
        u, v = _power_iteration(mats.detach(), u, 1)
        chunks = [layer.chunks for layer in layers]
        torch._foreach_copy_([layer.spectral_u for layer in layers], u.split(chunks))
        torch._foreach_copy_([layer.spectral_v for layer in layers], v.split(chunks))
        for layer in layers:
            layer.power_iteration_due = False
    gamma = _gamma(torch.cat([layer.spectral_scale for layer in layers]), first.version)
    scaled = (mats * (gamma.view(-1, 1, 1) / _sigma(mats, u, v))).view(-1, cols)
    if scaled.dtype != weight.dtype:
        scaled = scaled.to(weight.dtype)
    return list(scaled.split([layer.out_features for layer in layers]))


def _gamma(p: Tensor, version: int) -> Tensor:
    """``gamma`` from the learned ``p``: ``p`` (version 1) or ``softplus(p) + 0.05``."""
    p = p if p.dtype == torch.float32 else p.float()
    return p if version == 1 else F.softplus(p) + MIN_SPECTRAL_SCALE


class SpectralLinear(nn.Linear):
    """``nn.Linear`` whose weight is used as ``gamma / sigma(W) * W`` (σReparam, per chunk).

    Args:
        in_features: as ``nn.Linear``.
        out_features: as ``nn.Linear``.
        bias: as ``nn.Linear``.
        chunks: row blocks of ``W`` reparametrized separately (3 for a fused qkv projection).
        version: how ``spectral_scale`` gives ``gamma``: 1, ``gamma = p``; 2,
            ``gamma = softplus(p) + 0.05`` (NVlabs/RADIO; see the module docstring).

    ``[..., in] -> [..., out]``. After :func:`request_power_iteration`, the next training-mode
    forward first runs one power iteration (no gradient) that refines
    ``spectral_u``/``spectral_v``; ``sigma = u^T W v`` is computed in float32 whatever the
    weight dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        chunks: int = 1,
        version: int = 1,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if chunks < 1 or out_features % chunks:
            raise ValueError(f"out_features {out_features} is not divisible into {chunks} chunks")
        if version not in VERSIONS:
            raise ValueError(f"σReparam version {version} does not exist; use 1 or 2")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.chunks = chunks
        self.version = version
        if version != 1:  # version 1 state dicts keep the names they had before versions
            self.register_buffer("spectral_version", torch.tensor(version, device=device))
        self.spectral_scale = nn.Parameter(torch.ones(chunks, device=device))
        self.register_buffer(
            "spectral_u", torch.zeros(chunks, out_features // chunks, device=device)
        )
        self.register_buffer("spectral_v", torch.zeros(chunks, in_features, device=device))
        self.power_iteration_due = False
        self.current_step: _Step | None = None
        self.reset_spectral_state()

    @classmethod
    def from_linear(cls, linear: nn.Linear, chunks: int = 1, version: int = 1) -> SpectralLinear:
        """A σReparam layer computing exactly what ``linear`` computes (same weight and bias)."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            chunks=chunks,
            version=version,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        layer.reset_spectral_state()
        return layer

    def _matrices(self, weight: Tensor) -> Tensor:
        """``[C, out / C, in]`` float32 view of the weight's chunks."""
        return weight.float().reshape(self.chunks, -1, self.in_features)

    def scale(self) -> Tensor:
        """``[C]`` float32 ``gamma`` per chunk: ``p`` (version 1) or ``softplus(p) + 0.05``."""
        return _gamma(self.spectral_scale, self.version)

    def _parameter_for(self, gamma: Tensor) -> Tensor:
        """``[C]`` the ``p`` that gives ``gamma`` (version 2: clamped to ``0.05 + 1e-5``)."""
        if self.version == 1:
            return gamma
        return _inverse_softplus((gamma - MIN_SPECTRAL_SCALE).clamp_min(_MIN_SOFTPLUS))

    @torch.no_grad()
    def reset_spectral_state(self) -> None:
        """Converge ``u``, ``v`` on the current weight and set ``gamma = sigma`` (identity)."""
        if self.weight.is_meta:  # shapes only (a build on the meta device): nothing to converge
            return
        u, v, sigma = _converged_state(self._matrices(self.weight))
        self.spectral_u.copy_(u)
        self.spectral_v.copy_(v)
        self.spectral_scale.copy_(self._parameter_for(sigma))

    def effective_weight(self) -> Tensor:
        """``[out, in]`` the weight the layer applies: ``gamma_c / sigma_c * W_c`` per chunk.

        In training mode, when a power iteration is due (:func:`request_power_iteration`), one
        power iteration (no gradient) first refines ``u`` and ``v``. Inside
        :func:`spectral_step`, the step's weights of all layers, computed together.
        """
        if self.training and self.current_step is not None:
            return self.current_step.weight(self)
        return effective_weights([self])[0]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.effective_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, chunks={self.chunks}, version={self.version}"

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Tensor],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """A plain ``nn.Linear`` entry (``weight``/``bias`` only: a checkpoint trained without
        σReparam, or a folded one: a published model) loads as the same function, with the
        spectral state of the loaded weight's exact top singular vectors (:func:`_exact_state`),
        so that training's power iterations leave it where it is. An entry of the other version
        is refused (its ``spectral_scale`` would give another ``gamma``)."""
        names = [prefix + n for n in (SPECTRAL_SCALE, "spectral_u", "spectral_v")]
        weight = state_dict.get(prefix + "weight")
        plain = weight is not None and weight.shape == self.weight.shape
        version_key = prefix + "spectral_version"
        if plain and not any(n in state_dict for n in names):
            u, v, sigma = _exact_state(self._matrices(weight))
            state_dict.update(zip(names, (self._parameter_for(sigma), u, v), strict=True))
            if self.version != 1:
                state_dict[version_key] = torch.tensor(self.version)
        saved = int(state_dict.get(version_key, 1))
        if names[0] in state_dict and saved != self.version:
            error_msgs.append(
                f"{prefix}spectral_scale was trained with σReparam version {saved}, this student "
                f"uses version {self.version}: set "
                f"model.student.init_args.spectral_reparam_version: {saved}"
            )
            return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def enable_spectral_reparam(module: nn.Module, version: int = 1) -> int:
    """Replace every ``nn.Linear`` inside ``module`` by an equal :class:`SpectralLinear` of
    ``version`` (1: ``gamma = p``; 2: ``gamma = softplus(p) + 0.05``, NVlabs/RADIO).

    A child named ``qkv`` (timm's fused attention projection) gets 3 chunks. Returns the number
    of layers replaced; the module computes the same function afterwards.
    """
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                chunks = 3 if name == "qkv" else 1
                setattr(parent, name, SpectralLinear.from_linear(child, chunks, version))
                replaced += 1
    return replaced


@torch.no_grad()
def fold_spectral_reparam(module: nn.Module) -> nn.Module:
    """Replace every :class:`SpectralLinear` in ``module`` by a plain ``nn.Linear`` holding its
    eval-mode effective weight (``gamma / sigma * W`` with the stored ``u``, ``v``), in place.

    The folded module computes what the reparametrized one computes in eval mode; its state
    dict has plain ``weight``/``bias`` names. Returns ``module`` (a full, unsharded module).
    """
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SpectralLinear):
                was_training = child.training
                child.eval()
                weight = child.effective_weight()
                child.train(was_training)
                plain = nn.Linear(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    device=weight.device,
                    dtype=weight.dtype,
                )
                plain.weight.copy_(weight)
                if child.bias is not None:
                    plain.bias.copy_(child.bias)
                plain.train(was_training)
                setattr(parent, name, plain)
    return module
