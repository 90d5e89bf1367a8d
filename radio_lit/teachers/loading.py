"""Building large teachers fast and small: meta-device construction, weight files, precision,
and one-line errors for weights that cannot be fetched.

A teacher whose weights come from a file does not need the random initialization its
constructor runs (minutes and a second copy of the weights for a ViT-g or a 7B model). It is
built on the ``meta`` device (shapes only, no memory, no initialization) and the file's tensors
are then *assigned* as its parameters (``load_state_dict(assign=True)``): one copy of the
weights, the file's. Buffers that are not in a state dict (timm's RoPE tables) are computed
afterwards by the modules' own ``init_non_persistent_buffers``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

#: Teacher precisions a config may name.
TeacherDtype = Literal["float32", "bfloat16", "float16"]

M = TypeVar("M", bound=nn.Module)


def torch_dtype(dtype: TeacherDtype | None) -> torch.dtype | None:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``None`` stays ``None`` (the weights' own dtype)."""
    return None if dtype is None else getattr(torch, dtype)


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Tensors of a weights file, never pickled code: safetensors, or ``torch.load`` with
    ``weights_only=True`` (a ``{"state_dict": ...}`` / ``{"model": ...}`` wrapper is opened)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    for key in ("state_dict", "model"):
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
    return dict(state)


def build_on_meta(factory: Callable[[], M]) -> M:
    """``factory()`` run on the meta device: the module's structure, no memory, no init."""
    with torch.device("meta"):
        return factory()


def assign_weights(net: nn.Module, state: Mapping[str, Tensor], strict: bool = True) -> None:
    """Make ``state``'s tensors ``net``'s parameters and buffers (``assign=True``: no copy),
    then compute the buffers no state dict holds.

    ``net`` is typically built by :func:`build_on_meta`. Its non-persistent buffers are
    allocated on the CPU and filled by each module's ``init_non_persistent_buffers`` (timm's
    convention). A meta tensor left over means the architecture computes something at
    construction that this cannot recompute; ``RuntimeError`` names it.
    """
    net.load_state_dict(state, strict=strict, assign=True)
    materialize(net)


@contextmanager
def assigning_loads(net: nn.Module) -> Iterator[None]:
    """While the block runs, every ``load_state_dict`` into ``net`` assigns instead of
    copying, as ``assign=True`` does: for a library's own loader (open_clip's
    ``load_checkpoint``, which converts keys first) on a meta-built model.

    Uses the public ``register_load_state_dict_pre_hook``: each module's hook sets the
    ``assign_to_params_buffers`` flag that ``load_state_dict(assign=True)`` would set.
    """

    def assign(module: nn.Module, *args: object) -> None:
        args[2]["assign_to_params_buffers"] = True  # (state_dict, prefix, local_metadata, ...)

    handles = [m.register_load_state_dict_pre_hook(assign) for m in net.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def materialize(net: nn.Module) -> None:
    """Allocate and compute the non-persistent buffers of a meta-built ``net`` whose weights
    were assigned; ``RuntimeError`` naming any tensor still on the meta device."""
    for module in net.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device="cpu")
    for module in net.modules():
        init = getattr(module, "init_non_persistent_buffers", None)
        if callable(init):
            init()
    left = [name for name, t in (*net.named_parameters(), *net.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(
            f"{type(net).__name__} built on the meta device still has {left[:3]} unset after "
            "loading: the weights file misses them or the module computes them at construction."
        )


def cast(net: M, dtype: TeacherDtype | None) -> M:
    """``net`` in ``dtype`` (floating tensors only), or unchanged for ``None``."""
    return net if dtype is None else net.to(torch_dtype(dtype))


#: What a failed download raises: connection, missing-cache and gated-repository errors are
#: OSErrors in huggingface_hub, transformers and timm (open_clip re-raises them as the cause of
#: a RuntimeError).
_DOWNLOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ConnectionError)


def _download_failure(error: BaseException) -> BaseException | None:
    """The download error in ``error``'s cause chain, if any."""
    while error is not None:
        if isinstance(error, _DOWNLOAD_ERRORS):
            return error
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def download_errors(teacher: str, model_id: str, local_hint: str) -> Iterator[None]:
    """Turn a failed download of ``model_id`` into one line naming ``teacher``, the id and
    how to pass local weights instead (``local_hint``).

    Hugging Face's hub fails at once when ``HF_HUB_OFFLINE=1`` is set (the setting for an
    offline cluster); without it, a connection error is reported after the hub's own retry.
    """
    try:
        yield
    except Exception as raised:
        error = _download_failure(raised)
        if error is None:
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(
            f"{teacher}: cannot fetch {model_id!r} ({reason[:160]}). {local_hint}"
        ) from raised
